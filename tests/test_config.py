"""Bad configurations get a clear message naming the key, before anything runs."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config import ConfigError, check_config_file, expand, parse_size, validate_config
from harness.profiles import profile_config

ROOT = Path(__file__).resolve().parents[1]
MAIN = yaml.safe_load((ROOT / "config/experiments.yaml").read_text())


def cfg():
    return copy.deepcopy(MAIN)


def test_shipped_configs_are_valid_and_expand_readably():
    runs = validate_config(cfg())
    ids = [r.run_id for r in runs]
    for regime in ("seed-box", "disk-box"):  # the findings' configurations in both regimes
        assert f"baseline-q2@{regime}" in ids and f"pread-madvise-mlock@{regime}" in ids
        assert f"odirect-cache@{regime}" in ids
    # finding 12's pair: pread-madvise-mlock with `auto`'s policy and the other one beside it
    assert {"wait-policy-libgomp@seed-box", "wait-policy-passive@disk-box"} <= set(ids)
    assert not {"wait-policy-libgomp@disk-box", "wait-policy-passive@seed-box"} & set(ids)
    # the LRU sweep, write-in-place and lookahead under disk-box only (extended adds seed-box)
    assert "lru--lru-budget-mb-900@disk-box" in ids and "lru--lru-budget-mb-900@seed-box" not in ids
    assert "lookahead@disk-box" in ids and "lookahead@seed-box" not in ids
    assert "madvise@disk-box" in ids and "madvise@seed-box" not in ids
    assert not any(i.startswith("lru-1200") for i in ids)
    assert {"expert-cache@seed-box", "expert-cache@disk-box"} <= set(ids)  # finding 13's
    assert len(ids) == len(set(ids)) == 25
    assert sum(r.repeats for r in runs) == 60
    # seed-box's repeats from its design table (profiles.seed-box.run_defaults.repeats)
    assert {r.repeats for r in runs if r.profile == "seed-box"} == {3}
    # the window: 4 warm-up tokens, then 32 measured under disk-box and 16 under seed-box
    by_id = {r.run_id: r for r in runs}
    assert (by_id["baseline@disk-box"].tokens, by_id["baseline@disk-box"].warmup_tokens) == (36, 4)
    assert (by_id["baseline@seed-box"].tokens, by_id["baseline@seed-box"].warmup_tokens) == (20, 4)
    # the window against the 16 tokens after it: demand paging, the study's design, findings 11-13
    assert {i.split("@")[0] for i, r in by_id.items() if r.later_tokens == 16} == {
        "baseline", "pread-madvise", "pread-madvise-mlock", "odirect-cache", "expert-cache",
        "wait-policy-libgomp", "wait-policy-passive"}
    assert validate_config(yaml.safe_load((ROOT / ".test/config/experiments.yaml").read_text()))


def test_the_extended_config_adds_to_the_default():
    from snakemake.utils import update_config

    c = cfg()
    update_config(c, yaml.safe_load((ROOT / "config/extended.yaml").read_text()))
    ids = {r.run_id for r in validate_config(c)}
    assert {"populate@seed-box", "routing-trace@disk-box", "lookahead@seed-box",
            "lru--lru-budget-mb-0@seed-box", "write-in-place@seed-box", "lru-1200@disk-box",
            "odirect-cache-variants--warm-start-off--predict-experts-8@disk-box", "madvise@seed-box"} <= ids
    assert len(ids) == 54


def test_list_values_expand_to_every_combination():
    c = cfg()
    c["profile"] = "seed-box"
    c["experiments"] = {"grid": {"model": ["olmoe-q4", "olmoe-q2"], "mechanism": ["none", "madvise"],
                                 "tokens": [8, 16]}}
    runs = expand(c)
    assert len(runs) == 8
    assert runs[0].run_id == "grid--model-olmoe-q4--mechanism-none--tokens-8"
    assert {(r.model, r.mechanism, r.tokens) for r in runs} == {
        (m, k, t) for m in ("olmoe-q4", "olmoe-q2") for k in ("none", "madvise") for t in (8, 16)}


def _set(path, value):
    def f(c):
        d = c
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return f


def _delete(path):
    def f(c):
        d = c
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return f


def _rename(path, old, new):
    """Rename a key of the mapping at `path` (keeping what refers to it consistent)."""
    def f(c):
        d = c
        for k in path:
            d = d[k]
        d[new] = d.pop(old)
        for e in c["experiments"].values():
            if e.get("model") == old:
                e["model"] = new
        if c.get("profile") == old or old in (c.get("profile") or []):
            c["profile"] = new
        for k in ("baseline_models",):
            c["ceilings"][k] = [new if m == old else m for m in c["ceilings"].get(k, [])]
    return f


def _dup(c):  # an entry whose expansion collides with another's run id
    c["experiments"]["lru--lru-budget-mb-0"] = {"model": "olmoe-q4", "mechanism": "none"}


BAD = {
    "typo in a top-level key": (_set(["experimentz"], {}), "experimentz"),
    "typo in an experiment key": (_set(["experiments", "baseline", "mechansim"], "none"), "mechansim"),
    # the schema's enum refuses it, naming the value and the key's place in the schema
    "unknown mechanism": (_set(["experiments", "madvise", "mechanism"], "lru"),
                          "experiments.madvise.mechanism: 'lru' is not one of the mechanisms: none, madvise"),
    "unknown mechanism in a list": (_set(["experiments", "madvise", "mechanism"], ["none", "lru"]),
                                    "'lru' is not one of ['none', 'madvise'"),
    "unknown lookahead base": (_set(["experiments", "madvise", "lookahead_base"], "lookahead"),
                               "lookahead_base: 'lookahead' is not one of the base mechanisms"),
    "lookahead three layers ahead": (_set(["experiments", "madvise", "lookahead_layers"], 3),
                                     "lookahead_layers"),
    "unknown quant": (_set(["models", "olmoe-q4", "quant"], "Q3_XXL"), "Q3_XXL"),
    "negative size": (_set(["profiles", "seed-box", "ram_budget"], -5), "negative"),
    "unparseable size": (_set(["profiles", "seed-box", "read_bps"], "fast"), "'fast' is not a size"),
    "RAM budget below the non-expert tensors": (_set(["profiles", "seed-box", "ram_budget"], "100MiB"),
                                                "non-expert tensors (at least"),
    "model with no source": (_delete(["models", "olmoe-q2", "source"]), "source"),
    "experiment naming a missing model": (_set(["experiments", "madvise", "model"], "olmoe-q5"),
                                          "'olmoe-q5' is not one of the models"),
    "huggingface model without sha256": (_set(["models", "real"], {
        "source": "huggingface", "repo": "a/b", "file": "x.gguf", "revision": "main"}), "sha256"),
    "duplicate run ids": (_dup, "duplicate run id 'lru--lru-budget-mb-0'"),
    "unknown profile": (_set(["profile"], "laptop"), "'laptop' is not one of the profiles"),
    "zero tokens": (_set(["experiments", "madvise", "tokens"], 0), "tokens"),
    "unknown synthetic shape": (_set(["models", "olmoe-q4", "shape"], "olmoe-2b"), "olmoe-2b"),
    "empty list": (_set(["experiments", "lru", "lru_budget_mb"], []), "empty list"),
    "negative LRU budget": (_set(["experiments", "lru", "lru_budget_mb"], [-1]), "lru_budget_mb"),
    "listing a key that cannot be listed": (_set(["experiments", "madvise", "prompt"], ["a", "b"]),
                                            "prompt"),
    "empty prompt": (_set(["experiments", "madvise", "prompt"], ""), "madvise.prompt: '' is empty"),
    "whitespace-only prompt": (_set(["defaults", "prompt"], " \t\n"), ".prompt: ' \\t\\n' is empty"),
    "negative read-ahead": (_set(["profiles", "seed-box", "read_ahead_kb"], -1), "read_ahead_kb"),
    "zero CPU quota": (_set(["profiles", "seed-box", "cpu_quota"], 0), "cpu_quota"),
    "unparseable write cap": (_set(["profiles", "seed-box", "write_bps"], "lots"), "'lots' is not a size"),
    # options a mechanism ignores would make duplicate measurements under new names
    "LRU budget on madvise": (_set(["experiments", "madvise", "lru_budget_mb"], 256),
                              "madvise does not read lru_budget_mb"),
    "writeback on pread+madvise": (_set(["experiments", "pread-madvise", "writeback"], "sync"),
                                   "pread+madvise does not read writeback"),
    "lookahead option on none": (_set(["experiments", "baseline", "lookahead_experts"], 4),
                                 "none does not read lookahead_experts"),
    # a dense model given to a mechanism that prefetches experts fails only at run time otherwise
    "dense model to a prefetch mechanism": (_set(["experiments", "madvise", "model"], "qwen-q8"),
                                            "is dense"),
    "more lookahead experts than the model has": (
        _set(["experiments", "lookahead", "lookahead_experts"], 65), "more than model"),
    # unbounded sizes: hours of measurement from a typo
    "3000 tokens": (_set(["experiments", "madvise", "tokens"], 3000),
                    "3000 is greater than the maximum of 2048"),
    "a 50 KB prompt": (_set(["defaults", "prompt"], "x" * 50_000), "over the bound of 4000"),
    "a week's time limit": (_set(["defaults", "time_limit_s"], 7 * 86400), "time_limit_s"),
    "100 repeats": (_set(["experiments", "madvise", "repeats"], 100),
                    "100 is greater than the maximum of 20"),
    "a 1 TB LRU budget": (_set(["experiments", "lru", "lru_budget_mb"], [10**6]),
                          "1000000 is greater than the maximum of 65536"),
    # a hub or local model without its quant cannot be paired Q4_K_M/Q2_K
    "hub model without quant": (_set(["models", "real"], {
        "source": "huggingface", "repo": "a/b", "file": "x.gguf", "revision": "main",
        "sha256": "0" * 64}), "models.real.quant: missing"),
    "local model without quant": (_set(["models", "mine"], {"source": "path", "path": "/m.gguf"}),
                                  "models.mine.quant: missing"),
    "a profile listed twice": (_set(["profile"], ["seed-box", "seed-box"]), "each profile once"),
    "a list naming an unknown profile": (_set(["profile"], ["seed-box", "laptop"]),
                                         "'laptop' is not one of the profiles"),
    "an I/O-share target of 1": (_set(["profiles", "seed-box", "io_share_target"], 1.0),
                                 "io_share_target"),
    "an unknown OpenMP wait policy": (_set(["experiments", "madvise", "omp_wait_policy"], "sleepy"),
                                      "omp_wait_policy: 'sleepy' is not one of auto, passive, "
                                      "libgomp, active"),
    "a queue depth of 1000": (_set(["ceilings", "random_queue_depths"], [1, 1000]),
                              "1000 is greater than the maximum of 256"),
    "random reads of 64 GiB": (_set(["ceilings", "random_read_mib"], 65536), "random_read_mib"),
    # names become paths under results/ and run ids; cluster keys reach sbatch through a shell
    "a model named out of results/": (_rename(["models"], "olmoe-q2", "../../../tmp/escape"),
                                      "models.../../../tmp/escape: '../../../tmp/escape' is not a "
                                      "usable name"),
    "a model name with a slash": (_rename(["models"], "olmoe-q2", "a/b"), "is not a usable name"),
    "a profile named out of results/": (_rename(["profiles"], "native", "../x"),
                                        "profiles.../x"),
    "a shell command as the cluster node": (_set(["cluster", "node"], "n1; touch /tmp/owned"),
                                            "cluster.node: 'n1; touch /tmp/owned' is not a SLURM"),
    "a relative node-local directory": (_set(["cluster", "local_dir"], "scratch"),
                                        "cluster.local_dir: 'scratch' must be an absolute path"),
    # machine-dependent bounds and text the tokenizer cannot take, refused before any job
    "512 threads on this machine": (_set(["experiments", "madvise", "threads"], 512),
                                    "threads: 512 is more than the"),
    "a lone surrogate in the prompt": (_set(["defaults", "prompt"], "\ud800 begins"),
                                       "is not text the tokenizer can take"),
    "a baseline of a model not in models:": (_set(["ceilings", "baseline_models"], ["olmoe-q5"]),
                                             "ceilings.baseline_models: 'olmoe-q5' is not one of"),
}


def test_a_study_of_several_profiles_runs_every_experiment_under_each():
    c = cfg()
    for e in c["experiments"].values():  # every entry in every regime (none names its own)
        e.pop("profiles", None)
    c["profile"] = ["seed-box", "native"]
    runs = validate_config(c)
    c1 = copy.deepcopy(c)
    c1["profile"] = "seed-box"
    one = validate_config(c1)
    assert len(runs) == 2 * len(one)
    assert {r.run_id for r in runs} == {f"{r.run_id}@{p}" for r in one for p in ("seed-box", "native")}
    assert {r.profile for r in runs if r.run_id.endswith("@native")} == {"native"}
    # a single profile keeps its run ids (and the paths of every earlier results tree)
    assert {r.profile for r in one} == {"seed-box"} and not any("@" in r.run_id for r in one)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_refused_with_a_message_naming_the_key(case):
    mutate, needle = BAD[case]
    c = cfg()
    mutate(c)
    with pytest.raises(ConfigError) as e:
        validate_config(c)
    assert needle in str(e.value)


@pytest.mark.parametrize("size,expected", [(1536, 1536), ("150MB", 150_000_000), ("1.5GiB", 1610612736),
                                           ("512 MiB", 536870912)])
def test_parse_size(size, expected):
    assert parse_size(size, "x") == expected


@pytest.mark.parametrize("case", ["typo in an experiment key", "unknown mechanism",
                                  "RAM budget below the non-expert tensors"])
def test_snakemake_refuses_bad_config_before_any_job(case, tmp_path):
    mutate, needle = BAD[case]
    c = cfg()
    mutate(c)
    (tmp_path / "config").mkdir()
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(c))
    res = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores",
                          "1", "--directory", str(tmp_path), "results/final"],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert needle in res.stdout + res.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def test_a_key_written_twice_is_refused_naming_its_line(tmp_path):
    text = (ROOT / "config/experiments.yaml").read_text()
    (tmp_path / "ok.yaml").write_text(text)
    check_config_file(tmp_path / "ok.yaml")  # the shipped config has no key twice
    twice = text.replace("  baseline:\n    model: olmoe-q4\n",
                         "  baseline:\n    model: olmoe-q4\n    model: olmoe-q2\n", 1)
    assert twice != text
    (tmp_path / "twice.yaml").write_text(twice)
    with pytest.raises(ConfigError, match=r"line \d+: key 'model' is written twice"):
        check_config_file(tmp_path / "twice.yaml")
    # and Snakemake stops on it before any job
    (tmp_path / "wd" / "config").mkdir(parents=True)
    (tmp_path / "wd" / "config" / "experiments.yaml").write_text(twice)
    res = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n",
                          "--directory", str(tmp_path / "wd"), "results/final"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "written twice" in res.stdout + res.stderr


def test_how_a_profile_is_read_is_not_what_its_measurements_depend_on():
    # a measurement's params carry its profile: the minimum effect and the description change
    # how results are read, so editing them must not re-measure; a limit must
    c = cfg()
    before = profile_config(c, "seed-box")
    c["profiles"]["seed-box"].update(min_effect=0.2, description="another text")
    assert profile_config(c, "seed-box") == before
    c["profiles"]["seed-box"]["read_bps"] = "100MB"
    assert profile_config(c, "seed-box") != before
    with pytest.raises(ConfigError, match="min_effect"):
        validate_config({**cfg(), "profiles": {**cfg()["profiles"], "disk-box": {
            **cfg()["profiles"]["disk-box"], "min_effect": 1.5}}})


def test_a_profiles_run_defaults_sit_between_the_defaults_and_the_experiment():
    c = cfg()
    c["profiles"]["seed-box"]["run_defaults"] = {"tokens": 20, "repeats": 3}
    c["experiments"]["threadpool"]["tokens"] = 40
    runs = {r.run_id: r for r in validate_config(c)}
    assert runs["baseline@seed-box"].tokens == 20 and runs["baseline@seed-box"].repeats == 3
    assert runs["baseline@disk-box"].tokens == c["defaults"]["tokens"]
    assert runs["threadpool@seed-box"].tokens == 40  # the experiment's own value wins
    # the study's defaults are not overridden by a schema default of run_defaults
    assert runs["baseline@seed-box"].warmup_tokens == c["defaults"]["warmup_tokens"]
    c["profiles"]["seed-box"]["run_defaults"] = {"tokens": 4, "warmup_tokens": 4}
    with pytest.raises(ConfigError, match="leaves no measured window"):
        validate_config(c)
    c["profiles"]["seed-box"]["run_defaults"] = {"cache_budget_mb": 600}
    with pytest.raises(ConfigError, match="run_defaults.cache_budget_mb: a mechanism's option"):
        validate_config(c)
    c["profiles"]["seed-box"]["run_defaults"] = {"tokenz": 4}
    with pytest.raises(ConfigError, match="tokenz"):
        validate_config(c)


def test_an_experiment_runs_under_the_profiles_it_names():
    c = cfg()
    c["experiments"]["madvise"]["profiles"] = ["disk-box"]
    ids = [r.run_id for r in validate_config(c)]
    assert "madvise@disk-box" in ids and "madvise@seed-box" not in ids
    assert "baseline@seed-box" in ids
    c["experiments"]["madvise"]["profiles"] = ["disk_box"]
    with pytest.raises(ConfigError, match="'disk_box' is not a profile"):
        validate_config(c)
    c["experiments"]["madvise"]["profiles"] = []
    with pytest.raises(ConfigError, match="madvise"):
        validate_config(c)


def _one_budget_study(budget_mib: int, profile="seed-box") -> dict:
    c = cfg()
    c["experiments"]["odirect-cache"]["cache_budget_mb"] = budget_mib
    c["profile"] = profile
    return c


def test_a_memory_sized_parameter_is_bounded_by_what_the_profiles_budget_leaves():
    from harness import bounds

    c = cfg()
    budget = parse_size(c["profiles"]["seed-box"]["ram_budget"], "x")
    left_mib = bounds.memory_left(budget, c["models"]["olmoe-q4"]) // 2**20
    # the budget less the model's non-expert tensors (at least 268 MB at Q4_K_M's 4.5 bits) and
    # the stated margin: about 1,357 MiB of 1.7 GiB, above the study's 1,200
    assert 1300 < left_mib < 1400
    assert validate_config(_one_budget_study(left_mib))  # just inside
    with pytest.raises(ConfigError) as e:  # just outside
        validate_config(_one_budget_study(left_mib + 1))
    msg = str(e.value)
    assert "experiments.odirect-cache.cache_budget_mb" in msg and f"{left_mib} MiB at most" in msg
    assert "seed-box" in msg and "1825 MB" in msg
    # an entry is checked under every profile it runs in: a smaller budget elsewhere refuses it
    c = _one_budget_study(1000, ["seed-box", "disk-box"])
    c["profiles"]["disk-box"]["ram_budget"] = "1GiB"
    with pytest.raises(ConfigError, match="profile disk-box's ram_budget"):
        validate_config(c)
    # the LRU's budget too (every parameter whose unit is memory), and a profile without a RAM
    # budget bounds nothing
    c = cfg()
    c["experiments"]["lru"]["lru_budget_mb"] = [0, 4000]
    with pytest.raises(ConfigError, match="lru.lru_budget_mb: 4000 MiB"):
        validate_config(c)
    c["profiles"]["disk-box"].pop("ram_budget")
    c["experiments"]["lru"]["profiles"] = ["disk-box"]
    assert validate_config(c)


def test_a_run_id_longer_than_the_file_system_holds_is_refused(tmp_path):
    from harness import bounds

    c = cfg()
    c["profile"] = "disk-box"
    name_max, _ = bounds.name_limits(tmp_path)
    body = c["experiments"].pop("madvise")
    # with one profile the run id is the entry's name: exactly the limit fits, one byte more not
    c["experiments"]["m" * name_max] = body
    from harness.config import check

    assert any(r.run_id == "m" * name_max for r in check(c, tmp_path))
    c["experiments"]["m" * (name_max + 1)] = c["experiments"].pop("m" * name_max)
    with pytest.raises(ConfigError, match=rf"experiments\.m+: run id .* is {name_max + 1} bytes"):
        check(c, tmp_path)
    # the suffixes count: `@<profile>` and a listed value's `--key-value`
    c = cfg()
    suffix = len("@seed-box")
    c["experiments"]["m" * (name_max - suffix + 1)] = c["experiments"].pop("madvise")
    with pytest.raises(ConfigError, match=f"is {name_max + 1} bytes"):
        check(c, tmp_path)
    # a deep working directory: the longest path a run makes is checked too
    assert bounds.path_problem("x", tmp_path, (255, 4096)) == ""
    assert "makes a path of" in bounds.path_problem("x" * 200, tmp_path, (255, 300))


def test_a_study_that_measures_nothing_is_refused():
    c = cfg()
    c["experiments"] = {}
    with pytest.raises(ConfigError, match="experiments: empty"):
        validate_config(c)
    c = cfg()
    for body in c["experiments"].values():
        body["profiles"] = ["disk-box"]
    c["profile"] = "seed-box"
    with pytest.raises(ConfigError, match="profile: 'seed-box' runs no experiment"):
        validate_config(c)
    # one profile of two left with nothing to measure is refused too
    c["profile"] = ["seed-box", "disk-box"]
    with pytest.raises(ConfigError, match="profile: 'seed-box' runs no experiment"):
        validate_config(c)


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["experiments"]["odirect-cache"].update(cache_budget_mb=4000),
     "cache_budget_mb: 4000 MiB is more than"),
    (lambda c: c["experiments"].update({"x" * 300: c["experiments"].pop("madvise")}), "bytes"),
    (lambda c: c.update(experiments={}), "experiments: empty"),
])
def test_snakemake_dry_run_refuses_what_the_box_cannot_hold(mutate, needle, tmp_path):
    c = cfg()
    mutate(c)
    (tmp_path / "config").mkdir()
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(c))
    res = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n",
                          "--directory", str(tmp_path), "results/final"],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert needle in res.stdout + res.stderr
    assert not (tmp_path / "results").exists()


def test_every_profile_key_is_declared_once_and_reaches_the_limits():
    import argparse
    import dataclasses

    from harness import profile_keys
    from harness.__main__ import add_limits
    from harness.box.limits import DISK_LIMITS, Limits
    from harness.profiles import profile_limits

    # the shipped profiles use only declared keys (the generated schema refuses others)
    for prof in cfg()["profiles"].values():
        assert set(prof) <= set(profile_keys.BY_NAME)
    lim = profile_limits(cfg(), "/x", cpu_quota=0.1, profile="seed-box")
    assert (lim.ram_bytes, lim.read_bps, lim.write_bps, lim.read_ahead_kb, lim.cpu_quota) == \
        (parse_size("1.7GiB", "x"), 150_000_000, 150_000_000, 128, 0.1)
    assert profile_limits(cfg(), "/x", ram=False, profile="seed-box").ram_bytes is None
    assert {f.name for f in dataclasses.fields(Limits)} == \
        {k.limit for k in profile_keys.LIMITS} | {"device_path", "allow_unenforced"}
    assert {"read_bps", "write_bps", "read_ahead_kb"} <= set(DISK_LIMITS)
    assert "ram_bytes" not in DISK_LIMITS and "cpu_quota" not in DISK_LIMITS
    # the command line's limit flags, one per limit that has one
    ap = argparse.ArgumentParser()
    add_limits(ap)
    a = ap.parse_args(["--ram-budget", "1GiB", "--read-ahead-kb", "64", "--cpu-quota", "0.5"])
    assert (a.ram_budget, a.read_ahead_kb, a.cpu_quota, a.read_bps) == ("1GiB", 64, 0.5, None)
    # each declared bound is the schema's: just past it is refused, naming the key
    for k in profile_keys.KEYS:
        for bound, past in ((k.minimum, -1), (k.maximum, +1)):
            if bound is None:
                continue
            c = cfg()
            c["profiles"]["seed-box"][k.name] = bound if (k.exclusive_minimum and past < 0) or \
                (k.exclusive_maximum and past > 0) else bound + past
            with pytest.raises(ConfigError, match=k.name):
                validate_config(c)
