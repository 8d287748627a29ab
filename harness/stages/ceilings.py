"""The machine's ceilings, measured inside the same limits as the runs (CPU quota included).

I/O: O_DIRECT sequential reads (no page cache) of a file on the models' filesystem, several
samples at different offsets; then reads as the mechanisms issue them, of one expert slab's size at
random slab-aligned offsets, buffered (after evicting the file) and O_DIRECT, at several queue
depths (threads each holding one read in flight), each with the CPU it cost. Compute: llama-bench
decode of the dense model, cold then warm, and of the MoE model fully cached with no RAM budget,
with `--repack 0` (the kernels the harness runs: it loads with use_extra_bufts off) and with
llama-bench's default repack beside it. Stock
baselines: llama-bench decode of each OLMoE quant under the profile: mmap with the default repack,
mmap with `--repack 0`, and direct I/O.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import libc
from harness.box import measurelock, pagecache
from harness.contract import Status
from harness.box.limits import Limits, run_cgroup
from harness.parameters import BY_NAME
from harness.util import (left_by_dead_process, owner_tag, resolve_wait_policy, utcnow,
                          with_wait_policy)

log = logging.getLogger(__name__)

CHUNK = 8 << 20


def _cpu_s() -> float:
    """The process's user and kernel CPU seconds, every thread, at nanosecond resolution
    (os.times counts 10 ms ticks: too coarse for a second's reading)."""
    return time.process_time()


def odirect_read(path: str, offset: int, nbytes: int) -> dict:
    """Read nbytes at offset with O_DIRECT; returns MB/s (10^6 bytes per second) and the CPU
    seconds (user and kernel) the reading cost."""
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        done = 0
        t0, c0 = time.perf_counter(), _cpu_s()
        while done < nbytes:
            n = os.preadv(fd, [memoryview(buf)[: min(CHUNK, nbytes - done)]], offset + done)
            if n <= 0:
                raise OSError(f"short O_DIRECT read at {offset + done} of {path}")
            done += n
        dt, cpu = time.perf_counter() - t0, _cpu_s() - c0
    finally:
        os.close(fd)
        buf.close()
    return {"mb_per_s": nbytes / dt / 1e6, "cpu_s": cpu}


# the access kinds of the random-read samples, named as harness.catalog.read_path names them
BUFFERED, ODIRECT = "buffered read", "O_DIRECT"
PAGE = 4096


def random_offsets(file_bytes: int, block: int, nbytes: int, seed: int) -> list[int]:
    """Block-aligned offsets, drawn without replacement (no read finds another's pages cached),
    covering nbytes (at most the whole file)."""
    import random

    slots = file_bytes // block
    n = min(slots, max(1, -(-nbytes // block)))
    return [i * block for i in random.Random(seed).sample(range(slots), n)]


def random_read(path: str, access: str, queue_depth: int, block: int, nbytes: int,
                seed: int = 0) -> dict:
    """`queue_depth` threads, each keeping one read of `block` bytes in flight (os.pread releases
    the GIL), at random block-aligned offsets until nbytes are read; buffered reads go through
    the page cache with the file's default advice, as the buffered mechanisms read. Returns MB/s,
    the bytes read and the CPU seconds (user and kernel, every thread) the reads cost."""
    import threading

    if block % PAGE:
        raise ValueError(f"block {block} is not a multiple of {PAGE} (O_DIRECT needs alignment)")
    offsets = random_offsets(os.path.getsize(path), block, nbytes, seed)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if access == ODIRECT else 0))
    lock, todo, errors = threading.Lock(), iter(offsets), []

    def reader():
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        try:
            while True:
                with lock:
                    off = next(todo, None)
                if off is None:
                    return
                if os.preadv(fd, [buf], off) != block:
                    raise OSError(f"short read at {off} of {path}")
        except OSError as e:
            errors.append(e)
        finally:
            buf.close()

    threads = [threading.Thread(target=reader) for _ in range(queue_depth)]
    try:
        t0, c0 = time.perf_counter(), _cpu_s()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt, cpu = time.perf_counter() - t0, _cpu_s() - c0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    done = len(offsets) * block
    return {"mb_per_s": done / dt / 1e6, "bytes": done, "cpu_s": cpu}


def make_test_file(path: Path, nbytes: int) -> None:
    """A file of incompressible bytes to read back (written once, fsynced, evicted)."""
    block = os.urandom(CHUNK)
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[: min(CHUNK, left)])
            left -= CHUNK
        f.flush()
        os.fsync(f.fileno())
    pagecache.evict(path)


# no external measurement may run unbounded: llama-bench on a throttled box takes minutes, not hours
EXTERNAL_TIME_LIMIT_S = 3600


def in_cgroup(limits: Limits, argv: list[str], env=None, stdout=None, stderr=None,
              time_limit_s: float = EXTERNAL_TIME_LIMIT_S) -> tuple[int, dict]:
    """Run argv inside a fresh cgroup with the limits, under the machine's measurement lock and a
    time limit; returns (exit code, limits in force). The child dies with this process, and on
    SIGTERM/SIGINT everything in the cgroup is killed before the cgroup is removed."""
    def preexec():
        libc.die_with_parent(signal.SIGKILL)
        if cg.dirs:
            cg.enter()

    with measurelock.interruptible(), measurelock.exclusive(" ".join(argv[:3])), \
            run_cgroup(limits) as cg:
        try:
            res = subprocess.run(argv, env=env, stdout=stdout, stderr=stderr, preexec_fn=preexec,
                                 timeout=time_limit_s)
            rc = res.returncode
        except subprocess.TimeoutExpired:
            log.warning(f"{argv[0]} passed its time limit of {time_limit_s:.0f} s: killed")
            rc = -signal.SIGKILL
        finally:
            cg.kill_all()
        return rc, dict(cg.in_force, peak_cgroup_bytes=cg.peak_bytes(),
                        oom_killed=cg.oom_killed())


# the random-read samples' queue depths: one read in flight (pread in the decoding thread) up to
# many (an asynchronous reader such as odirect-cache); schema default of ceilings.random_queue_depths
QUEUE_DEPTHS = (1, 4, 16, 32)


def io_ceiling(scratch_dir: Path, samples_mib: list[int], limits: Limits, slab_bytes: int = 0,
               random_mib: int = 0, queue_depths=QUEUE_DEPTHS) -> list[dict]:
    """The I/O ceiling's rows: sequential O_DIRECT samples, then (with slab_bytes and random_mib)
    random reads of one expert slab's size, buffered and O_DIRECT, at each queue depth."""
    scratch_dir.mkdir(parents=True, exist_ok=True)
    # a killed measurement's test file (its name carries the pid) is removed by the next one
    for left in left_by_dead_process(scratch_dir.glob(".io-*")):
        left.unlink(missing_ok=True)
    test = scratch_dir / f".io-{owner_tag()}-ceiling.bin"
    total = sum(samples_mib) << 20
    # the lock around the whole ceiling: writing its 2.5 GiB test file disturbs a measurement as
    # much as reading it; SIGTERM runs the finally below, so no test file is left
    with measurelock.interruptible(), measurelock.exclusive("the I/O ceiling"):
        try:
            make_test_file(test, total)
            rows = _io_samples(test, scratch_dir, samples_mib, limits)
            if slab_bytes and random_mib:
                rows += _random_samples(test, scratch_dir, limits, slab_bytes, random_mib,
                                        queue_depths, first=len(rows))
            return rows
        finally:
            test.unlink(missing_ok=True)
            for left in scratch_dir.glob(f".io-{owner_tag()}-*"):
                left.unlink(missing_ok=True)


def _sample(scratch_dir: Path, limits: Limits, argv_tail: list[str], i: int) -> tuple[dict, dict]:
    """One sample in its own process inside a fresh cgroup with the profile's limits."""
    argv = [sys.executable, "-m", "harness.stages.ceilings", *argv_tail]
    res_path = scratch_dir / f".io-{owner_tag()}-{i}.json"
    with open(res_path, "w") as out:
        rc, in_force = in_cgroup(limits, argv, stdout=out)
    if rc != 0:
        raise RuntimeError(f"I/O ceiling sample {i} ({' '.join(argv_tail[:1])}) failed (exit {rc})")
    res = json.loads(res_path.read_text())
    res_path.unlink()
    return res, in_force


def _row(i, scratch_dir, pattern, access, depth, block, offset, nbytes, res, start, in_force):
    return {"sample": i, "directory": str(scratch_dir), "pattern": pattern, "access": access,
            "queue_depth": depth, "block_bytes": block, "offset_bytes": offset, "bytes": nbytes,
            "mb_per_s": res["mb_per_s"], "cpu_s": res["cpu_s"],
            "cpu_ms_per_mb": res["cpu_s"] * 1e3 / (nbytes / 1e6),
            "start_utc": start, "end_utc": utcnow(),
            "read_bps_limit": in_force.get("read_bps"), "cpu_quota": in_force.get("cpu_quota"),
            "cgroup": in_force.get("cgroup")}


def _io_samples(test: Path, scratch_dir: Path, samples_mib: list[int], limits: Limits) -> list[dict]:
    rows, offset = [], 0
    for i, mib in enumerate(samples_mib):
        start = utcnow()
        res, in_force = _sample(scratch_dir, limits, ["odirect", str(test), str(offset),
                                                      str(mib << 20)], i)
        rows.append(_row(i, scratch_dir, "sequential", ODIRECT, 1, CHUNK, offset, mib << 20, res,
                         start, in_force))
        log.info(f"io ceiling sample {i}: {mib} MiB at offset {offset}: {res['mb_per_s']:.1f} MB/s")
        offset += mib << 20
    return rows


def _random_samples(test: Path, scratch_dir: Path, limits: Limits, slab_bytes: int, random_mib: int,
                    queue_depths, first: int) -> list[dict]:
    block = -(-slab_bytes // PAGE) * PAGE  # a slab rounded up to whole pages, as O_DIRECT reads it
    rows, i = [], first
    for access in (BUFFERED, ODIRECT):
        for depth in queue_depths:
            pagecache.evict(test)  # every buffered sample starts from the disk
            start = utcnow()
            res, in_force = _sample(scratch_dir, limits, [
                "random", str(test), access, str(depth), str(block), str(random_mib << 20), str(i)], i)
            rows.append(_row(i, scratch_dir, "random", access, depth, block, None, res["bytes"],
                             res, start, in_force))
            log.info(f"io ceiling sample {i}: random reads ({access}) of {block} bytes at queue depth "
                     f"{depth}: {res['mb_per_s']:.1f} MB/s, {rows[-1]['cpu_ms_per_mb']:.2f} ms CPU/MB")
            i += 1
    return rows


def expert_slab_bytes(layout: dict) -> int:
    """The median size of one expert's slab of one tensor in a layout (what a mechanism reads at
    once); 0 for a model without experts."""
    import statistics

    sizes = [t["bytes_per_expert"] for t in layout.get("expert_tensors", [])]
    return int(statistics.median(sizes)) if sizes else 0


# llama-bench's OpenMP threads wait as a run's do by default (harness.parameters), under the
# same limits
WAIT_POLICY = BY_NAME["omp_wait_policy"].default


def llama_bench(bench: str, model: str, threads: int, tokens: int, load_mode: str, limits: Limits,
                lib_dir: str, log_file, extra_args: tuple[str, ...] = (), *,
                warmup: bool = False, repetitions: int = 1, wait_policy: str = WAIT_POLICY) -> dict:
    """llama-bench's measurement of `tokens` generated tokens, `repetitions` times, in the limits'
    cgroup, its OpenMP threads waiting by `wait_policy` (`auto` resolved against the limits' CPU
    quota). Without `warmup` (the calibrations' way) the first token's start-up work is in the
    figure; with it llama-bench decodes one token first, like the harness's steady rate, which
    leaves the first generated token out. `tok_per_s`: the mean of the repetitions;
    `fastest_tok_per_s`: the fastest one."""
    argv = [bench, "-m", model, "-p", "0", "-n", str(tokens), "-r", str(repetitions),
            *(() if warmup else ("--no-warmup",)), "-t",
            str(threads), "-lm", load_mode, *extra_args, "-o", "json"]
    out_path = Path(log_file.name).with_suffix(".bench.json")
    start = utcnow()
    policy = resolve_wait_policy(wait_policy, limits.cpu_quota)
    with open(out_path, "w") as out:
        rc, in_force = in_cgroup(limits, argv, env=with_wait_policy(
            dict(os.environ, LD_LIBRARY_PATH=lib_dir), policy), stdout=out, stderr=log_file)
    text = out_path.read_text()
    out_path.unlink()
    rec = {"model": model, "load_mode": " ".join([load_mode, *extra_args]), "threads": threads,
           "tokens": tokens, "warmup": warmup, "repetitions": repetitions, "omp_wait_policy": policy,
           "start_utc": start, "end_utc": utcnow(), "exit_code": rc, "limits_in_force": in_force,
           "argv": argv}
    if rc == 0:
        data = json.loads(text)
        rec["llama_bench"] = data
        rec["tok_per_s"] = data[0]["avg_ts"] if data else None
        rec["samples_ts"] = data[0].get("samples_ts") if data else None
        rec["fastest_tok_per_s"] = max(rec["samples_ts"] or [rec["tok_per_s"] or 0.0]) or None
        rec["status"] = Status.OK.value
    else:
        rec["tok_per_s"] = None
        # a stock tool killed inside the budget is a result too (llama-bench repacks weights
        # into anonymous memory by default, so it cannot run where the harness can)
        rec["status"] = (Status.MEMORY.value if in_force.get("oom_killed")
                         else f"{Status.FAILED.value} (exit {rc})")
    return rec


# the calibration configuration of an I/O-share target: the study's best design, short runs of
# `measured_tokens` after the study's own warm-up (the profile's warmup_tokens)
IO_SHARE_RUN = {"mechanism": "pread+madvise", "mlock_non_expert": True, "measured_tokens": 5}


def io_share_window(config: dict) -> tuple[int, int]:
    """(tokens, warmup_tokens) of a calibration run: the warm-up the study's runs under this
    profile take, then IO_SHARE_RUN's measured tokens."""
    from harness.config import profile_run_defaults

    warmup = profile_run_defaults(config, config["profile"]).get(
        "warmup_tokens", BY_NAME["warmup_tokens"].default)
    return warmup + IO_SHARE_RUN["measured_tokens"], warmup


def io_share_calibration(config: dict, manifest: dict, model: str, model_info: dict, layout: str,
                         target: float, prompt: str | None = None) -> dict:
    """The CPU quota under which pread+madvise+mlock on the MoE model spends `target` of its
    steady token waiting on I/O (harness.analysis.attribution), each step a cold harness run
    measured over the window the study's runs use."""
    import tempfile

    import pandas as pd

    from harness.analysis import attribution
    from harness.run import supervise
    from harness.stages.calibrate import calibrate_io_share
    from harness.config import adhoc_spec
    from harness.profiles import profile_limits

    prof = config["profiles"][config["profile"]]
    info = dict(model_info, path=model)
    tokens, warmup = io_share_window(config)

    def measure(quota):
        spec = adhoc_spec("io-share-calibration", Path(model).stem, IO_SHARE_RUN["mechanism"],
                          mlock_non_expert=IO_SHARE_RUN["mlock_non_expert"],
                          tokens=tokens, warmup_tokens=warmup, threads=prof["threads"],
                          time_limit_s=3600, **({"prompt": prompt} if prompt else {}))
        with tempfile.TemporaryDirectory(prefix=".io-share-") as d:
            rec = supervise.run(spec, d, lib_dir=manifest["lib_dir"], build=manifest,
                                model_info=info, layout_path=layout,
                                limits=profile_limits(config, model, cpu_quota=quota),
                                time_limit_s=3600)
            if rec.status != "ok":
                return float("nan")
            tok = pd.read_csv(Path(d) / "tokens.csv")
        return attribution.run_attribution(tok[tok.phase == "gen"], warmup)["io_wait_share"]

    return calibrate_io_share(measure, target, cpus=prof["threads"])


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    if argv[0] == "odirect":
        print(json.dumps(odirect_read(argv[1], int(argv[2]), int(argv[3]))))
        return 0
    if argv[0] == "random":
        path, access, depth, block, nbytes, seed = argv[1:7]
        print(json.dumps(random_read(path, access, int(depth), int(block), int(nbytes), int(seed))))
        return 0
    raise SystemExit(f"unknown subcommand {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main())
