"""Every mechanism on a tiny model, through the real supervisor, worker and llama.cpp build."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from harness import record
from harness.run import supervise
from harness.config import adhoc_spec
from harness.box.limits import Limits, cgroup_version
from harness.run.mechanisms import REGISTRY
from harness.util import sha256_file



def spec(mechanism, **kw):
    opts = {"lru_budget_mb": 4, "prefetch_threads": 2, "tokens": 12, "time_limit_s": 120}
    return adhoc_spec(f"t-{mechanism}", "olmoe-tiny-Q4_K_M", mechanism, **{**opts, **kw})


def run(manifest, model, out, s, limits=None, time_limit=120):
    return supervise.run(s, out, lib_dir=manifest["lib_dir"], build=manifest, model_info=model["info"],
                         layout_path=model["layout"], limits=limits or Limits(),
                         time_limit_s=time_limit)


@pytest.fixture(scope="module")
def all_runs(manifest, tiny_models, tmp_path_factory):
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    out = {}
    for name in REGISTRY:
        d = tmp_path_factory.mktemp(name.replace("+", "_"))
        rec = run(manifest, model, d, spec(name, mlock_non_expert=(name == "pread+madvise")))
        out[name] = (rec, d)
    return out


def test_every_mechanism_completes_with_full_records(all_runs):
    for name, (rec, d) in all_runs.items():
        assert rec.status == "ok", name
        assert rec.tokens_completed == 12
        tok = pd.read_csv(d / "tokens.csv")
        assert list(tok.phase) == ["prompt"] + ["gen"] * 12
        assert (tok.wall_s > 0).all()
        if cgroup_version() is not None:  # every run has a cgroup: its block-I/O counter is read
            assert (tok.cgroup_read_bytes != -1).all(), name  # -1 = no counter file
            # the load read the cold model inside the cgroup: the counter saw it
            moments = rec.summary.model_moments
            assert (moments["after_load"]["cgroup_read_bytes"]
                    - moments["before_load"]["cgroup_read_bytes"]) > 0.5 * os.path.getsize(
                        rec.model.path) or moments["after_load"]["residency"] > 0.9, name
        on_disk = json.loads((d / "run.json").read_text())
        for key in ("spec", "build", "machine", "model", "limits_in_force", "start_utc", "end_utc",
                    "summary"):
            assert key in on_disk, (name, key)
        assert on_disk["build"]["commit"] and on_disk["model"]["synthetic"] is True
        assert on_disk["format"] == record.FORMAT_VERSION


def test_prompt_tokenizes_to_gpt_neox_tokens(all_runs):
    rec, _ = all_runs["none"]
    # GPT-NeoX BPE ids of "The history of the Roman Empire begins with"
    assert rec.summary.prompt_tokens == [510, 2892, 273, 253, 8370, 13958, 9513, 342]


def test_mechanisms_never_change_tokens_or_routing(all_runs):
    ref_rec, ref_dir = all_runs["none"]
    ref_experts = pd.read_csv(ref_dir / "experts.csv")
    n_layer, n_used = 4, 2
    # every layer of every generated token, n_used each; the prompt's last layer only its last token
    assert len(ref_experts) == n_used * (n_layer * (12 + 8) - 7)
    for name, (rec, d) in all_runs.items():
        assert rec.summary.generated_tokens == ref_rec.summary.generated_tokens, name
        ex = pd.read_csv(d / "experts.csv")
        pd.testing.assert_frame_equal(ex, ref_experts, obj=name)


def test_byte_accounting_is_exact(all_runs, tiny_models):
    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    per_layer = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
    for name, (rec, d) in all_runs.items():
        ex = pd.read_csv(d / "experts.csv")
        tok = pd.read_csv(d / "tokens.csv")
        # the sum of slab sizes over each decode's unique routed experts per layer
        gen = ex[ex.token >= 8]
        prompt = ex[ex.token < 8]
        expected = sum(per_layer[layer] * g.expert.nunique()
                       for (_t, layer), g in gen.groupby(["token", "layer"]))
        expected += sum(per_layer[layer] * g.expert.nunique() for layer, g in prompt.groupby("layer"))
        assert int(tok.bytes_routed.sum()) == expected
        if name == "none":
            assert rec.summary.byte_accounting_ok is None
            assert tok.bytes_prefetched.sum() == 0
        else:
            assert rec.summary.byte_accounting_ok is True, name
            assert int(tok.bytes_prefetched.sum()) == expected, name


def test_mlock_records_non_expert_bytes(all_runs, tiny_models):
    rec, _ = all_runs["pread+madvise"]
    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    assert rec.summary.mlocked_bytes == lay["non_expert_bytes"]
    assert rec.summary.mlocked_tensors == lay["non_expert_count"]


def test_write_in_place_leaves_model_file_unchanged(all_runs, tiny_models):
    rec, d = all_runs["write-in-place"]
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    assert sha256_file(model["gguf"]) == model["info"]["sha256"] == rec.model_sha256_checked_before
    assert rec.model_unchanged is True
    assert not list(d.parent.glob(".scratch-*"))


def test_cold_start_and_what_the_load_leaves(all_runs):
    for name, (rec, _) in all_runs.items():
        m = rec.summary.model_moments
        # evicted before the worker starts, and measured again inside it before the load ...
        assert rec.residency_at_start < 0.01 and m["before_load"]["residency"] < 0.01, name
        # ... and llama.cpp's populating load (MAP_POPULATE) then caches a tiny model whole
        assert m["before_first_decode"]["residency"] > 0.9, name


@pytest.fixture(scope="module")
def cold_runs(manifest, tiny_models, tmp_path_factory):
    """Every mechanism with the experts paged out after the load: decoding starts cold."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    out = {}
    for name in REGISTRY:
        d = tmp_path_factory.mktemp("cold-" + name.replace("+", "_"))
        # no read-ahead: a fault reads its own page, not the neighbouring layers' slabs
        # residency measured on every token: all four are warm-up tokens
        rec = run(manifest, model, d, spec(name, tokens=4, evict_after_load=True, warmup_tokens=4),
                  limits=Limits(read_ahead_kb=0, device_path=model["gguf"]))
        out[name] = (rec, pd.read_csv(d / "tokens.csv"))
    return out


SYNCHRONOUS = ("pread+madvise", "populate", "write-in-place", "lru-odirect")


def test_prefetching_mechanisms_make_routed_slabs_resident_and_none_does_not(cold_runs):
    none_missing = cold_runs["none"][1].bytes_missing.sum()
    for name, (rec, tok) in cold_runs.items():
        assert rec.status == "ok", name
        first = tok.iloc[0]  # the prompt: nothing routed is resident after the eviction ...
        if name in ("lookahead", "odirect-cache"):  # ... unless it was read ahead on a prediction
            assert tok.bytes_missing.sum() < none_missing, name
        else:
            assert first.bytes_missing > 0.5 * first.bytes_routed, name
        if name == "none":  # demand paging: the hook returns before any fault
            assert (tok.bytes_missing_after == tok.bytes_missing).all()
        elif name in SYNCHRONOUS:  # every routed byte resident before the matmuls
            assert (tok.bytes_missing_after == 0).all(), name
        assert rec.summary.byte_accounting_ok in (None, True), name


def test_pread_alone_warms_the_page_cache_without_the_advice(manifest, tiny_models, tmp_path,
                                                            cold_runs):
    """willneed_after_pread off: the same reads, no madvise, every routed byte still resident
    before the matmuls (the pread put it in the page cache)."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    rec = run(manifest, model, tmp_path, spec("pread+madvise", tokens=4, evict_after_load=True,
                                              willneed_after_pread=False, warmup_tokens=4),
              limits=Limits(read_ahead_kb=0, device_path=model["gguf"]))
    tok = pd.read_csv(tmp_path / "tokens.csv")
    assert rec.status == "ok" and rec.spec.mechanism_options["willneed_after_pread"] is False
    assert (tok.madvise_s == 0).all() and (tok.bytes_missing_after == 0).all()
    assert rec.summary.byte_accounting_ok is True
    with_advice = cold_runs["pread+madvise"][1]
    assert (with_advice.madvise_s > 0).any()  # the default advises: the switch did something
    assert list(tok.bytes_read) == list(with_advice.bytes_read)


def test_bytes_read_are_what_the_syscalls_returned(cold_runs, tiny_models):
    for name in ("pread+madvise", "threadpool", "write-in-place"):
        rec, tok = cold_runs[name]
        assert (tok.bytes_read == tok.bytes_routed).all(), name
    _, tok = cold_runs["madvise"]
    assert (tok.bytes_read == 0).all()  # advice returns no byte count: nothing claimed as read
    _, tok = cold_runs["lru-odirect"]  # budget 4 MB: hits are not reads
    assert (tok.bytes_read <= tok.bytes_routed).all() and tok.bytes_read.iloc[0] > 0


class FakeTensor:
    def __init__(self, type=26, nb0=4, ne0=8, ne1=1, nb1=32):
        self.type, self.nb, self.ne = type, [nb0, nb1], [ne0, ne1]


@pytest.mark.parametrize("bad,needle", [
    (dict(type=0), "expected I32"), (dict(nb0=8), r"nb\[0\] = 8"), (dict(ne0=4), "n_expert_used"),
    (dict(nb1=2), "row stride"), (dict(ne1=3), "3 rows for a batch of 1")])
def test_hook_refuses_a_routing_tensor_it_cannot_read(tiny_models, bad, needle):
    from harness.models.layout import Layout
    from harness.run.hook import RoutingHook

    hook = RoutingHook.__new__(RoutingHook)
    hook.layout, hook.batch_n = Layout(tiny_models["olmoe-tiny-Q4_K_M"]["data"]), 1
    hook.check(FakeTensor(ne0=hook.layout.n_expert_used, nb1=4 * hook.layout.n_expert_used), 0)
    with pytest.raises(ValueError, match=needle):
        kw = dict(ne0=hook.layout.n_expert_used, nb1=4 * hook.layout.n_expert_used)
        kw.update(bad)
        hook.check(FakeTensor(**kw), 0)


class _NativeTopk:
    """hook.c's topk path driven directly: a hand-made ffn_moe_topk-0 tensor over ids in Python
    memory, the tiny model's file mapped read-only as the model, demand paging as the mechanism."""

    def __init__(self, manifest, model, batch_n=1):
        import ctypes
        import mmap
        import types

        from harness.build import bindings as hlib
        from harness.models.layout import Layout
        from harness.run.mechanisms import NoPrefetch, Residency
        from harness.run.hook import NativeRouting, RoutingHook
        from harness.run.worker import find_mapping

        self.ctypes, self.file = ctypes, open(model["gguf"], "rb")
        self.map = mmap.mmap(self.file.fileno(), 0, prot=mmap.PROT_READ)
        self.layout = Layout(model["data"])
        start, _, offset = find_mapping(model["gguf"])  # a read-only mmap has no buffer address
        base = start - offset
        mapped = types.SimpleNamespace(base=base, layout=self.layout, fd=self.file.fileno())
        mechanism = NoPrefetch.__new__(NoPrefetch)
        mechanism.model, mechanism.layout = mapped, self.layout
        hook = RoutingHook.__new__(RoutingHook)
        hook.mechanism, hook.layout, hook.log_experts, hook.calls = mechanism, self.layout, False, 0
        hook.error, hook.residency = None, Residency(mapped)
        self.native = NativeRouting(hook, manifest["hook_lib"], None, 64)
        self.native.begin(0, batch_n, True)
        self.tensor = hlib.GgmlTensor()
        self.tensor.name = b"ffn_moe_topk-0"
        self.eval = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(
            self.native.eval_fn)

    def __call__(self, ids, type=26, nb0=4, ne0=None, ne1=1, nb1=None, name=None, measure=True):
        c = self.ctypes
        n_used = self.layout.n_expert_used
        arr = (c.c_int32 * len(ids))(*ids)
        t = self.tensor
        t.type, t.data = type, c.addressof(arr)
        t.ne[0], t.ne[1] = n_used if ne0 is None else ne0, ne1
        t.nb[0], t.nb[1] = nb0, 4 * n_used if nb1 is None else nb1
        if name is not None:
            t.name = name
        self.native.begin(0, self.native.h.batch_n, True, measure)
        asked = self.eval(c.addressof(t), True, self.native.user_data)
        ok = self.eval(c.addressof(t), False, self.native.user_data)
        return asked, ok, self.native.h.error.decode()


def test_native_hook_records_a_routing_tensor_and_refuses_one_it_cannot_read(manifest, tiny_models):
    """The C path on hand-made tensors: good ids are recorded with their missing bytes (equal to
    Python's mincore count), every bad field or id stops the decode with a message naming it."""
    from harness.run.mechanisms import Residency

    drive = _NativeTopk(manifest, tiny_models["olmoe-tiny-Q4_K_M"])
    lay, h = drive.layout, drive.native.h
    good = list(range(lay.n_expert_used))
    asked, ok, err = drive(good[::-1])
    assert asked and ok and err == ""
    assert h.n_routed == 1 and h.n_rows == lay.n_expert_used
    assert sorted(drive.native.unique[: drive.native.unique_n[0]]) == good
    res = Residency(drive.native.hook.mechanism.model)
    want = sum(res.missing_bytes(s.offset, s.nbytes) for e in good for s in lay.slabs(0, e))
    assert h.missing == h.missing_after == want  # demand paging: nothing changed in between
    assert h.hook_ns > 0
    # a token of the measured window: the routing is read, no residency syscall is made
    calls = h.residency_calls
    asked, ok, err = drive(good, measure=False)
    assert asked and ok and h.n_routed == 1 and h.n_rows == lay.n_expert_used
    assert h.residency_calls == calls and h.missing == h.missing_after == 0
    # a node that is not routing is neither asked for nor observed
    asked, ok, _ = drive(good, name=b"ffn_moe_probs-0")
    assert not asked and ok and h.n_routed == 0
    bad = {"type is not I32": dict(type=0), "nb[0]": dict(nb0=8), "n_expert_used": dict(ne0=lay.n_expert_used + 1),
           "row stride": dict(nb1=2), "rows for the batch": dict(ne1=3)}
    for needle, kw in bad.items():
        asked, ok, err = drive(good, name=b"ffn_moe_topk-0", **kw)
        assert asked and not ok and needle in err, (needle, err)
    asked, ok, err = drive(good[:-1] + [lay.n_expert], name=b"ffn_moe_topk-0")
    assert not ok and f"routes to expert {lay.n_expert}" in err
    asked, ok, err = drive(good, name=f"ffn_moe_topk-{lay.n_layer}".encode())
    assert not ok and "not a MoE layer" in err


def test_native_hook_residency_by_cachestat_and_mincore_is_pythons(manifest, tiny_models):
    """The C path's two ways of counting missing bytes (cachestat on the file, mincore on the
    mapping) agree with Python's mincore, on slabs evicted (some bytes missing) and on the same
    slabs read back (none); with the whole layer cached, one cachestat call answers for it."""
    import ctypes
    import os

    from harness.run.mechanisms import Residency

    drive = _NativeTopk(manifest, tiny_models["olmoe-tiny-Q4_K_M"])
    lay, h, lib = drive.layout, drive.native.h, drive.native.lib
    lib.moe_hook_missing.restype = ctypes.c_int64
    res = Residency(drive.native.hook.mechanism.model)
    experts = [1, 2, 5]
    slabs = [s for e in experts for s in lay.slabs(0, e)]
    arr = (ctypes.c_int32 * len(experts))(*experts)

    def measured():
        out = {}
        for method, fd in (("cachestat", drive.file.fileno()), ("mincore", -1)):
            h.cache_fd, calls = fd, h.residency_calls
            out[method] = lib.moe_hook_missing(ctypes.byref(h), 0, arr, len(experts))
            out[f"{method} calls"] = h.residency_calls - calls
            assert h.cache_fd == fd, "cachestat is missing on this kernel: the test needs it"
        out["python"] = sum(res.missing_bytes(s.offset, s.nbytes) for s in slabs)
        return out

    # the whole file: the page cache may hold it in large folios, which a slab's range would split
    os.posix_fadvise(drive.file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    evicted = measured()
    assert evicted["python"] > 0.5 * sum(s.nbytes for s in slabs), evicted
    assert evicted["cachestat"] == evicted["mincore"] == evicted["python"], evicted
    # the layer's span was not all cached: one call for it, then one per slab
    assert evicted["cachestat calls"] == 1 + len(slabs) and evicted["mincore calls"] == len(slabs)
    for x in lay.data["expert_tensors"]:  # the whole of layer 0's expert tensors, read back
        if x["layer"] == 0:
            os.pread(drive.file.fileno(), x["bytes_per_expert"] * x["n_expert"], x["base_offset"])
    cached = measured()
    assert (cached["cachestat"], cached["mincore"], cached["python"]) == (0, 0, 0), cached
    assert cached["cachestat calls"] == 1 and cached["mincore calls"] == len(slabs), cached
    # a layer whose expert tensors lie far apart is not spanned (the call would walk the file
    # between them): one call per slab, all cached
    os.pread(drive.file.fileno(), os.fstat(drive.file.fileno()).st_size, 0)
    last = lay.n_layer - 1
    at = [(0 * lay.n_expert + e) * 4 + len(lay.slabs(0, e)) - 1 for e in experts]
    far = [lay.slabs(last, e)[-1].offset for e in experts]
    saved = [drive.native.slab_off[i] for i in at]
    for i, off in zip(at, far, strict=True):
        drive.native.slab_off[i] = off
    try:
        apart = measured()
    finally:
        for i, off in zip(at, saved, strict=True):
            drive.native.slab_off[i] = off
    assert apart["cachestat"] == 0 and apart["cachestat calls"] == len(slabs), apart


def test_a_disabled_native_hook_asks_for_nothing(manifest, tiny_models):
    drive = _NativeTopk(manifest, tiny_models["olmoe-tiny-Q4_K_M"])
    drive.native.begin(0, 1, False)
    asked = drive.eval(drive.ctypes.addressof(drive.tensor), True, drive.native.user_data)
    assert not asked and drive.native.h.asked == 1
    drive.native.begin(0, 1, True)
    assert drive.eval(drive.ctypes.addressof(drive.tensor), True, drive.native.user_data)


def test_layout_refuses_ids_it_does_not_have(tiny_models):
    from harness.models.layout import Layout

    lay = Layout(tiny_models["olmoe-tiny-Q4_K_M"]["data"])
    assert len(lay.slabs(0, lay.n_expert - 1)) == 3
    for layer, e in ((0, lay.n_expert), (0, -1), (lay.n_layer, 0)):
        with pytest.raises(IndexError):
            lay.slabs(layer, e)


def test_time_limit_is_a_result(manifest, tiny_models, tmp_path):
    # a link planted where the run writes its log: replaced by the run's file, never followed
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("not yours")
    (tmp_path / "worker.log").symlink_to(victim)
    # 2 s: on a machine that decodes the tiny model at ~1 ms a token, 4000 tokens took about 3
    rec = run(manifest, tiny_models["olmoe-tiny-Q4_K_M"], tmp_path, spec("none", tokens=4000),
              time_limit=2)
    assert rec.status == "killed: time"
    tok = pd.read_csv(tmp_path / "tokens.csv")
    assert rec.tokens_completed == len(tok) - 1 and rec.tokens_completed > 0
    assert tok.rss_bytes.gt(0).all()  # the RSS trail survives the kill
    # every token recorded keeps all its expert rows (the prompt's and each generated one's)
    ex = pd.read_csv(tmp_path / "experts.csv")
    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    n_prompt = int(tok[tok.phase == "prompt"].n_tokens.iloc[0])  # positions before the first
    per_position = ex.groupby("token").size()
    for i in range(rec.tokens_completed):  # the token being decoded at the kill may have fewer
        assert per_position.get(n_prompt + i, 0) == lay["n_layer"] * lay["n_expert_used"], i
    assert victim.read_text() == "not yours" and not (tmp_path / "worker.log").is_symlink()


def test_memory_kill_is_a_result(manifest, tiny_models, tmp_path):
    # a budget far below what even loading the model takes: the kernel kills the worker
    rec = run(manifest, tiny_models["olmoe-tiny-Q4_K_M"], tmp_path, spec("lru-odirect"),
              limits=Limits(ram_bytes=48 << 20))
    assert rec.status == "killed: memory"
    assert rec.limits_in_force["ram_bytes"] == 48 << 20
    assert rec.peak_cgroup_bytes <= 48 << 20


def test_cli_runs_one_configuration_by_hand(manifest, tiny_models, tmp_path):
    import subprocess
    import sys

    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(manifest))
    model = tmp_path / "m.gguf"
    model.write_bytes(open(tiny_models["olmoe-tiny-Q2_K"]["gguf"], "rb").read())
    res = subprocess.run([sys.executable, "-m", "harness", "-m", str(model), "--mechanism", "populate",
                          "-n", "6", "-q", "--manifest", str(mpath), "-o", str(tmp_path / "out"),
                          "--omp-wait-policy", "active"],
                         capture_output=True, text=True,
                         env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))  # the shell's is overridden
    assert res.returncode == 0, res.stderr[-2000:]
    rec = json.loads(res.stdout)
    assert rec["status"] == "ok" and rec["tokens_completed"] == 6
    # the worker's OpenMP threads waited as asked, and the record says so
    assert rec["spec"]["omp_wait_policy"] == "active"
    assert rec["attribution_sources"]["omp_wait_policy"] == "ACTIVE"
    assert rec["summary"]["byte_accounting_ok"] is True
    assert (tmp_path / "m.layout.json").exists()
    # logging off: no activation rows, only the header
    assert open(tmp_path / "out" / "experts.csv").read().count("\n") == 1
    # the same -o again: a directory that holds files is never written into (as root)
    again = subprocess.run([sys.executable, "-m", "harness", "-m", str(model), "-n", "2",
                            "--manifest", str(mpath), "-o", str(tmp_path / "out")],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    linked = subprocess.run([sys.executable, "-m", "harness", "-m", str(model), "-n", "2",
                             "--manifest", str(mpath), "-o", str(tmp_path / "link")],
                            capture_output=True, text=True)
    assert linked.returncode == 2 and not (tmp_path / "elsewhere").exists()


def test_the_wait_policy_reaches_the_environment_or_leaves_libgomps_default():
    from harness.util import resolve_wait_policy, with_wait_policy

    shell = {"OMP_WAIT_POLICY": "ACTIVE", "PATH": "/bin"}
    assert with_wait_policy(shell, "passive") == {"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}
    assert with_wait_policy(shell, "libgomp") == {"PATH": "/bin"}
    assert shell["OMP_WAIT_POLICY"] == "ACTIVE"  # the caller's dict is not changed
    # `auto` follows the CPU quota, and must be resolved before it reaches an environment
    assert resolve_wait_policy("auto", 0.12) == "passive"
    assert resolve_wait_policy("auto", None) == "libgomp"
    assert resolve_wait_policy("active", 0.12) == "active"
    with pytest.raises(ValueError):
        with_wait_policy(shell, "auto")


PROBE = '''
import json, sys
import numpy as np
import pandas as pd
from harness import catalog
from harness.run import mechanisms as mech, worker
from harness.contract import WorkerParams


@mech.register
class ProbsProbe(mech.NoPrefetch):
    """Demand paging that also keeps every layer's router probabilities (ffn_moe_probs-<L>)."""
    name = "probs-probe"
    info = catalog.MechanismInfo(name, "demand paging that keeps the router's probabilities",
                                 prefetches=False)
    observes = b"ffn_moe_probs-"

    def __init__(self, model, **o):
        super().__init__(model, **o)
        self.probs = []  # (token of the batch's first row, layer, rows)

    def begin_decode(self, first_token, n_tokens):
        self.batch = (first_token, n_tokens)

    def on_hidden(self, layer, rows):
        self.probs.append((self.batch, layer, rows))


out, layout, lib, model = sys.argv[1:5]
p = WorkerParams(out_dir=out, layout=layout, lib_dir=lib, model_path=model, mechanism="probs-probe",
                 prompt="The history of the Roman Empire begins with", tokens=6, threads=2)
w = worker.Worker(p)
try:
    w.load_and_verify(); w.prepare_mechanism(); w.make_context(); w.decode_all()
    n_used = w.layout.n_expert_used
    rows = []
    for (first, n), layer, probs in w.mechanism.probs:
        for r, row in enumerate(probs):
            token = first + n - len(probs) + r  # rows are the batch's last len(probs) tokens
            top = sorted(int(e) for e in np.argsort(-row, kind="stable")[:n_used])
            rows.append({"token": token, "layer": layer, "top": top})
finally:
    w.close()
print(json.dumps(rows))
'''


def test_hook_ids_are_the_top_k_of_the_router_probabilities(manifest, tiny_models, tmp_path):
    """Every layer and token, the prompt batch and the last layer included: the ids the hook read
    from ffn_moe_topk-<L> are the top n_expert_used of ffn_moe_probs-<L> (observed separately)."""
    import subprocess
    import sys

    model = tiny_models["olmoe-tiny-Q4_K_M"]
    res = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), model["layout"],
                          manifest["lib_dir"], model["gguf"]], capture_output=True, text=True,
                         env={"LLAMA_CPP_LIB_PATH": manifest["lib_dir"], "PATH": "/usr/bin:/bin",
                              "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0, res.stderr[-3000:]
    probes = json.loads(res.stdout.strip().splitlines()[-1])
    ex = pd.read_csv(tmp_path / "experts.csv.part")
    hooked = ex.groupby(["token", "layer"]).expert.apply(lambda s: sorted(s)).to_dict()
    n_layer = model["data"]["n_layer"]
    assert len(probes) == len(hooked) == n_layer * (6 + 8) - 7  # the prompt's last layer: 1 row
    for p in probes:
        assert hooked[(p["token"], p["layer"])] == p["top"], p
    assert {p["layer"] for p in probes if p["token"] < 8} == set(range(n_layer))  # the prompt too


def test_native_ask_path_observes_exactly_what_python_did(manifest, tiny_models, tmp_path, all_runs):
    """hook.c answers the scheduler's questions in C; the routing, tokens and records are the
    same as when every node asks Python, and only the routing nodes reach Python."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    native_rec, native_dir = all_runs["pread+madvise"]  # the default: native
    rec = run(manifest, model, tmp_path, spec("pread+madvise", mlock_non_expert=True, hook="python"))
    assert native_rec.summary.hook == "native" and rec.summary.hook == "python"
    assert rec.summary.generated_tokens == native_rec.summary.generated_tokens
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "experts.csv"),
                                  pd.read_csv(native_dir / "experts.csv"))
    s = native_rec.summary
    assert s.hook_nodes_passed == s.hook_calls == 4 * 13  # 4 layers, prompt + 12 tokens
    assert s.hook_nodes_asked > 10 * s.hook_nodes_passed  # the rest never reached Python


def test_hook_ab_switches_the_hook_off_for_every_other_token(manifest, tiny_models, tmp_path,
                                                             all_runs):
    """hook_ab (the benchmark's in-process A/B): generated tokens alternate hook on and off; the
    off ones route nothing into the records and take no hook time, and the text is unchanged."""
    base_rec, base_dir = all_runs["none"]
    rec = run(manifest, tiny_models["olmoe-tiny-Q4_K_M"], tmp_path, spec("none", hook_ab=True))
    assert rec.status == "ok"
    assert rec.summary.generated_tokens == base_rec.summary.generated_tokens
    tok = pd.read_csv(tmp_path / "tokens.csv")
    gen = tok[tok.phase == "gen"]
    assert list(gen.hook_on) == [1 - i % 2 for i in range(len(gen))]
    assert (tok[tok.phase == "prompt"].hook_on == 1).all()
    # (a hook-on token's own hook time can round to 0 at the microsecond: what it routed,
    # below, says the hook ran)
    assert (gen[gen.hook_on == 0].hook_s == 0).all() and gen[gen.hook_on == 1].hook_s.sum() > 0
    n_prompt = len(rec.summary.prompt_tokens)
    routed = set(pd.read_csv(tmp_path / "experts.csv").token)
    assert routed == set(range(n_prompt)) | {n_prompt + i for i in gen[gen.hook_on == 1]["index"]}
    assert (pd.read_csv(base_dir / "tokens.csv").hook_on == 1).all()  # without hook_ab: all on


def test_residency_method_follows_the_mapping(all_runs):
    """cachestat reads the file's page cache, right for a shared mapping of it; lru-odirect's
    private copies and odirect-cache's own memory are anonymous pages only mincore sees."""
    for name, (rec, _) in all_runs.items():
        want = "cachestat" if REGISTRY[name].weights_in_page_cache else "mincore"
        assert rec.summary.hook_residency == want, name
        assert rec.summary.hook_residency_calls > 0, name


@pytest.mark.skipif(cgroup_version() != 1, reason="the cgroup v1 writeback case")
def test_write_in_place_writes_count_against_the_run_only_with_sync_writeback(manifest, tiny_models,
                                                                              tmp_path):
    """On cgroup v1 the kernel's flusher writes dirty pages from the root cgroup: the run's own
    cgroup sees (almost) none of what write-in-place dirties. With writeback "sync" the run
    submits the writes itself, so its cgroup writes about what it dirties, under its throttle."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    limits = Limits(write_bps=50_000_000, device_path=model["gguf"])
    out = {}
    for mode in ("kernel", "sync"):
        rec = run(manifest, model, tmp_path / mode, spec("write-in-place", writeback=mode, tokens=6),
                  limits=limits)
        tok = pd.read_csv(tmp_path / mode / "tokens.csv")
        out[mode] = (rec, tok)
        assert rec.status == "ok" and rec.limits_in_force["write_bps"] == 50_000_000
    k_tok, s_tok = out["kernel"][1], out["sync"][1]
    assert s_tok.dirtied_bytes.sum() > 0 and k_tok.dirtied_bytes.sum() > 0
    assert s_tok.cgroup_write_bytes.sum() >= 0.5 * s_tok.dirtied_bytes.sum()
    assert k_tok.cgroup_write_bytes.sum() < 0.1 * k_tok.dirtied_bytes.sum()


@pytest.fixture(scope="module")
def odirect_runs(manifest, tiny_models, tmp_path_factory):
    """odirect-cache cold, at budget 0 and at a budget that holds the whole tiny model, without
    and with prediction; and warm (what the load left cached copied in) at that budget and at
    one that holds a single megabyte."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    out = {}
    cold = {"evict_after_load": True}
    for label, kw in (("b0", {"cache_budget_mb": 0, "predict_experts": 0, **cold}),
                      ("b900", {"cache_budget_mb": 900, "predict_experts": 0, **cold}),
                      ("b900-predict", {"cache_budget_mb": 900, "predict_experts": 3, **cold}),
                      ("b900-warm", {"cache_budget_mb": 900, "predict_experts": 0}),
                      ("b1-warm", {"cache_budget_mb": 1, "predict_experts": 0})):
        d = tmp_path_factory.mktemp("odirect-" + label)
        rec = run(manifest, model, d, spec("odirect-cache", tokens=8, io_depth=4, **kw))
        out[label] = (rec, pd.read_csv(d / "tokens.csv"))
    return out


def test_odirect_cache_keeps_nothing_at_budget_0_and_hits_when_it_may_keep(odirect_runs):
    rec0, tok0 = odirect_runs["b0"]
    rec9, tok9 = odirect_runs["b900"]
    for rec in (rec0, rec9):
        assert rec.status == "ok" and rec.summary.byte_accounting_ok is True
    # budget 0: every routed slab is read again at every layer of every token
    assert rec0.summary.cache_hits == 0
    assert (tok0.bytes_read == tok0.bytes_routed).all()
    # a budget that holds the model: an expert routed again is not read again
    assert rec9.summary.cache_hits > 0
    assert tok9.bytes_read.sum() < tok9.bytes_routed.sum()
    assert tok9.bytes_read.iloc[0] == tok9.bytes_routed.iloc[0]  # the prompt starts cold
    # memory follows the budget: what it keeps shows in the process's resident set
    assert tok0.rss_bytes.max() <= tok9.rss_bytes.max()


def test_odirect_cache_warm_start_copies_what_the_load_cached_within_its_budget(odirect_runs):
    rec, tok = odirect_runs["b900-warm"]
    cold_rec, cold = odirect_runs["b900"]
    small_rec, _ = odirect_runs["b1-warm"]
    for r in (rec, small_rec):
        assert r.status == "ok" and r.summary.byte_accounting_ok is True
    assert cold_rec.summary.bytes_warm_start == 0  # evicted: nothing resident to copy
    # the load leaves the tiny model cached: its slabs start in the cache, so the prompt reads
    # less than it routes, and the run less than the cold one
    assert rec.summary.bytes_warm_start > 2**20
    assert tok.bytes_read.iloc[0] < tok.bytes_routed.iloc[0]
    assert tok.bytes_read.sum() < cold.bytes_read.sum()
    # never beyond the budget: one megabyte holds a few of the tiny model's slabs at most
    assert 0 < small_rec.summary.bytes_warm_start <= 2**20
    assert rec.summary.generated_tokens == cold_rec.summary.generated_tokens


def test_odirect_cache_reads_the_predicted_slabs_ahead(odirect_runs):
    rec, tok = odirect_runs["b900-predict"]
    _, plain = odirect_runs["b900"]
    assert rec.status == "ok" and rec.summary.byte_accounting_ok is True
    assert rec.summary.bytes_read_ahead > 0
    # slabs read ahead are hits when routed: fewer reads on the routing path than without
    assert tok.bytes_read.sum() < plain.bytes_read.sum()


def test_keep_cache_skips_the_cold_start_only_for_a_model_wholly_cached(manifest, tiny_models,
                                                                        tmp_path, monkeypatch):
    from harness.box import pagecache

    model = tiny_models["olmoe-tiny-Q4_K_M"]
    evictions = []
    real = pagecache.cold_start
    monkeypatch.setattr(supervise.pagecache, "cold_start", lambda p: evictions.append(p) or real(p))
    # the sha256 check reads the whole file, which would cache it again before the switch looks
    monkeypatch.setattr(supervise, "_check_model_unchanged", lambda info, *where: None)
    pagecache.evict(model["info"]["path"])
    assert pagecache.residency(model["info"]["path"]) < 0.5
    s = spec("none", tokens=2, warm=True, keep_cache=True)
    # not cached: evicted and read whole as without the switch
    first = run(manifest, model, tmp_path / "first", s)
    assert first.status == "ok" and len(evictions) == 1
    assert first.residency_at_start > 0.999
    # wholly cached now: neither evicted nor re-read, and the record says it started cached
    again = run(manifest, model, tmp_path / "again", s)
    assert again.status == "ok" and len(evictions) == 1
    assert again.residency_before == again.residency_at_start > 0.999
    assert again.spec.keep_cache is True


def test_a_dense_model_under_a_prefetch_mechanism_is_refused_before_anything_runs(
        manifest, tiny_models, tmp_path):
    dense = tiny_models["qwen2-tiny-Q8_0"]
    with pytest.raises(supervise.RunFailed, match="is dense .*madvise prefetches experts"):
        run(manifest, dense, tmp_path / "out", spec("madvise"))
    assert not (tmp_path / "out").exists()


def test_the_load_reads_unthrottled_and_every_decode_is_throttled(manifest, tiny_models, tmp_path):
    """The read throttle and the CPU quota are applied between the load and the prompt: the load
    reads the cold model faster than the throttle would let it, and from the first decode on the
    cgroup reads no faster than the throttle (the experts paged out after the load, so decoding
    reads them again) and runs under the quota's periods."""
    if cgroup_version() is None:
        pytest.skip("no cgroup hierarchy")
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    throttle = 1_000_000  # bytes/s: the tiny model's load (~15 MB) would take seconds under it
    rec = run(manifest, model, tmp_path, spec("none", tokens=6, evict_after_load=True),
              limits=Limits(read_bps=throttle, read_ahead_kb=0, device_path=model["gguf"],
                            cpu_quota=1.5))
    assert rec.status == "ok"
    assert rec.limits_in_force["read_bps"] == throttle
    assert "first decode" in rec.limits_in_force["disk_throttle_from"]
    assert rec.limits_in_force["cpu_quota"] == 1.5
    assert "first decode" in rec.limits_in_force["cpu_quota_from"]
    m = rec.summary.model_moments
    load_read = m["after_load"]["cgroup_read_bytes"] - m["before_load"]["cgroup_read_bytes"]
    assert load_read > 0.5 * os.path.getsize(model["gguf"])  # the load read the model ...
    assert load_read / rec.summary.load_s > 3 * throttle  # ... unthrottled
    tok = pd.read_csv(tmp_path / "tokens.csv")
    decode_read = tok.cgroup_read_bytes.sum()
    assert decode_read > 2 * throttle  # enough bytes that the throttle decides the time
    assert decode_read / tok.wall_s.sum() < 1.3 * throttle
    # the quota was in force at the first decode (the prompt's): its periods were running
    assert tok.phase.iloc[0] == "prompt" and tok.nr_periods.iloc[0] > 0


def test_residency_is_checked_on_the_warmup_only_never_in_the_measured_window(
        manifest, tiny_models, tmp_path):
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    rec = run(manifest, model, tmp_path, spec("madvise", tokens=6, warmup_tokens=2))
    tok = pd.read_csv(tmp_path / "tokens.csv")
    assert rec.status == "ok" and rec.summary.hook_residency_calls > 0
    measured = tok[tok["index"] < 2]  # the prompt (-1) and the two warm-up tokens
    window = tok[tok["index"] >= 2]
    assert (measured.bytes_missing >= 0).all() and (measured.bytes_missing_after >= 0).all()
    assert (window.bytes_missing == -1).all() and (window.bytes_missing_after == -1).all()
    assert rec.summary.byte_accounting_ok is True  # the mechanism still read every routed slab


def test_a_filled_cache_takes_what_the_memory_limit_leaves():
    from harness.run.mechanisms.odirect import fill_budget

    mib = 2**20
    assert fill_budget(1000 * mib, 300 * mib, 100 * mib, 64 * mib) == 536 * mib
    assert fill_budget(400 * mib, 300 * mib, 100 * mib, 64 * mib) == 0  # nothing left
    assert fill_budget(None, 300 * mib, 100 * mib, 64 * mib) is None  # no limit: the budget stands


@pytest.fixture(scope="module")
def policy_runs(manifest, tiny_models, tmp_path_factory):
    """odirect-cache cold at a 1 MiB budget (a few of the tiny model's slabs) under each policy,
    and filled from a 400 MiB memory limit."""
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    out = {}
    for label, kw, limits in (
            ("lru", {"cache_policy": "lru"}, None), ("lfu", {"cache_policy": "lfu"}, None),
            ("fill", {"cache_policy": "lfu", "cache_fill": True},
             Limits(ram_bytes=400 * 2**20, device_path=model["gguf"]))):
        d = tmp_path_factory.mktemp("policy-" + label)
        rec = run(manifest, model, d, spec("odirect-cache", tokens=16, warmup_tokens=2,
                                           cache_budget_mb=1, predict_experts=0,
                                           evict_after_load=True, warm_start=False, **kw),
                  limits=limits)
        out[label] = (rec, pd.read_csv(d / "tokens.csv"), pd.read_csv(d / "experts.csv"))
    return out


def test_the_cache_reads_what_its_own_policys_replay_reads(policy_runs, tiny_models):
    """Per run, bytes read per window token within 5% of harness.analysis.policies' replay of
    the same policy at the same capacity on the run's own routing: the design and the code
    agree (the replay keeps whole experts, the cache slabs; both read every miss once)."""
    from harness.analysis import policies

    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
    for label in ("lru", "lfu"):
        rec, tok, experts = policy_runs[label]
        assert rec.status == "ok" and rec.summary.byte_accounting_ok is True
        assert rec.summary.cache_capacity_bytes == 2**20
        gen = tok[tok.phase == "gen"]
        measured = gen.bytes_read.iloc[2:].mean()
        steps = policies.decode_steps(experts, len(rec.summary.prompt_tokens))
        replayed = policies.window_bytes(
            policies.replay(steps, slab, rec.summary.cache_capacity_bytes, label), 2,
            rec.summary.tokens_completed)
        assert measured == pytest.approx(replayed, rel=0.05), label
        assert 0 < measured < gen.bytes_routed.iloc[2:].mean()  # it hits, and it misses


def test_a_filled_cache_measures_its_capacity_from_the_cgroup(policy_runs, tiny_models):
    rec, tok, experts = policy_runs["fill"]
    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    assert rec.status == "ok" and rec.limits_in_force["ram_bytes"] == 400 * 2**20
    cap = rec.summary.cache_capacity_bytes
    # the limit less the non-expert tensors, the worker's anonymous memory and the margin:
    # well above the 1 MiB budget it was given, below what the limit leaves of them
    assert 2**20 < cap < 400 * 2**20 - lay["non_expert_bytes"] - 64 * 2**20
    # the whole tiny model fits: each slab is read once, when it is first routed, never again
    slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
    first_reads = sum(slab[layer] for layer, _ in
                      experts[["layer", "expert"]].drop_duplicates().itertuples(index=False))
    assert tok.bytes_read.sum() == first_reads < tok.bytes_routed.sum()
