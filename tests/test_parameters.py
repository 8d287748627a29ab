"""Every place that names a run parameter or a runs.csv column is derived from its one
declaration (harness.parameters, harness.analysis.run_table.RUN_COLUMNS), and the generated files are current."""

import argparse
import inspect
from pathlib import Path

import pandas as pd
import pytest
import yaml

from harness import docs, parameters, record
from harness.__main__ import add_run_parameters
from harness.analysis import flags, floors, run_table
from harness.config import ConfigError, adhoc_spec, validate_config
from harness.contract import WorkerParams
from harness.run import supervise
from harness import catalog
from harness.catalog import base_mechanisms, read_path
from harness.run.mechanisms import REGISTRY, make, register

ROOT = Path(__file__).resolve().parents[1]
P = parameters.BY_NAME
REFERENCE_RUNS = ROOT / "reference/vm-2026-12-04c/results/runs"


def test_the_generated_files_are_current():
    assert docs.stale() == [], "run: python -m harness.docs"


def test_the_schema_fills_every_declared_default_and_refuses_each_bound():
    c = yaml.safe_load((ROOT / "config/experiments.yaml").read_text())
    c["defaults"] = {}
    validate_config(c)
    assert c["defaults"] == {p.name: p.default for p in parameters.PARAMETERS
                             if p.default is not None}
    for p in parameters.PARAMETERS:  # each declared maximum is the schema's too
        if p.maximum is None:
            continue
        bad = yaml.safe_load((ROOT / "config/experiments.yaml").read_text())
        bad["defaults"][p.name] = p.type(p.maximum + 1)
        with pytest.raises(ConfigError, match=p.name):
            validate_config(bad)


def test_one_spec_from_the_config_to_the_record_and_the_worker():
    """Each shipped run's spec, as config.expand makes it, is what the record holds and what the
    worker is given: nothing lost or renamed on the way."""
    runs = validate_config(yaml.safe_load((ROOT / "config/experiments.yaml").read_text()))
    for r in runs:
        d = {**r.as_dict(), "repeat": 1}
        record.check_spec(d, r.run_id)
        spec = record.Spec(**d)
        wp = WorkerParams(out_dir="o", layout="l", lib_dir=None, model_path="m",
                          mechanism_options=spec.mechanism_options,
                          **{k: getattr(spec, k) for k in parameters.WORKER_KEYS})
        assert (wp.mechanism, wp.tokens, wp.warmup_tokens, wp.threads, wp.mlock_non_expert) == \
            (r.mechanism, r.tokens, r.warmup_tokens, r.threads, r.mlock_non_expert), r.run_id
        assert spec.mechanism_options == {k: getattr(r, k) for k in parameters.options_of(r.mechanism)}
    # a worker parameter declared without a default (the profile gives threads) must be passed
    with pytest.raises(TypeError, match="threads"):
        WorkerParams(out_dir="o", layout="l", lib_dir=None, model_path="m", mechanism="none")
    # what the registry declares as not measured is what a run's identity leaves out
    assert parameters.NOT_MEASURED == ("later_tokens", "repeats", "time_limit_s")


def test_an_adhoc_spec_is_one_the_record_holds():
    spec = adhoc_spec("x", "m", "lookahead")
    record.check_spec(spec)  # the record holds every spec the supervisor is given
    assert set(spec["mechanism_options"]) == set(parameters.options_of("lookahead"))


def test_a_spec_the_record_cannot_hold_is_refused_before_anything_is_measured(tmp_path):
    spec = adhoc_spec("x", "m", "none")
    with pytest.raises(record.RecordError, match="does not declare: bogus"):
        record.check_spec({**spec, "bogus": 1})
    with pytest.raises(record.RecordError, match="missing: io_depth"):
        record.check_spec({k: v for k, v in spec.items() if k != "io_depth"})
    # supervise.run checks first: no model, no cgroup, no output directory was needed
    with pytest.raises(record.RecordError):
        supervise.run({**spec, "bogus": 1}, tmp_path / "out", lib_dir="", build={},
                      model_info={"path": str(tmp_path / "missing.gguf")}, layout_path="",
                      limits=None, time_limit_s=1)
    assert not (tmp_path / "out").exists()


def test_each_mechanism_takes_the_declared_options_with_no_defaults_of_its_own():
    for name, cls in REGISTRY.items():
        assert cls.options == parameters.options_of(name), name
        sig = inspect.signature(cls.__init__).parameters
        for o in cls.options:
            assert o in sig and sig[o].default is inspect.Parameter.empty, (name, o)
    assert set().union(*(p.mechanisms for p in parameters.PARAMETERS)) <= set(REGISTRY)
    assert "lookahead" not in base_mechanisms() and "madvise" in base_mechanisms()
    assert parameters.choices(P["lookahead_base"]) == base_mechanisms()
    with pytest.raises(KeyError, match="unknown mechanism"):
        make("lru", None)


def test_the_runtime_implements_exactly_the_catalog_with_its_traits():
    # every catalog entry is implemented, with the catalog's traits (a test's probe that states
    # its own traits may stand beside them)
    assert {n for n, cls in REGISTRY.items() if cls.info is catalog.BY_NAME.get(n)} == \
        set(catalog.NAMES)
    for name in catalog.NAMES:
        cls, info = REGISTRY[name], catalog.BY_NAME[name]
        assert (cls.read_path, cls.prefetches, cls.needs_scratch_copy, cls.weights_in_page_cache) \
            == (info.read_path, info.prefetches, info.needs_scratch_copy,
                info.weights_in_page_cache), name
    assert REGISTRY["odirect-cache"].read_path == "O_DIRECT" and not REGISTRY["none"].prefetches

    class Unlisted(REGISTRY["madvise"]):
        name = "madvise-twice"

    with pytest.raises(TypeError, match="not in harness.catalog"):
        register(Unlisted)
    assert "madvise-twice" not in REGISTRY


def test_a_wrapper_writes_the_model_through_its_base_only():
    assert catalog.writes_model("write-in-place") and not catalog.writes_model("madvise")
    assert catalog.writes_model("lookahead", {"lookahead_base": "write-in-place"})
    assert not catalog.writes_model("lookahead", {"lookahead_base": "pread+madvise"})
    assert not catalog.writes_model("lookahead")


def test_a_parameters_problem_comes_out_each_way():
    assert parameters.problem(P["tokens"], 8) == ""
    assert "over the bound" in parameters.problem(P["tokens"], 3000)
    assert "at least 1" in parameters.problem(P["tokens"], 0)
    assert "not a int" in parameters.problem(P["tokens"], True)  # a bool is no count
    assert parameters.problem(P["time_limit_s"], 1800) == ""  # an int is a number of seconds
    assert "over 0" in parameters.problem(P["time_limit_s"], 0)
    assert "not one of" in parameters.problem(P["lookahead_base"], "lookahead")
    assert "characters" in parameters.problem(P["prompt"], "x" * 5000)


def test_the_command_line_has_each_declared_flag_with_its_default():
    ap = argparse.ArgumentParser()
    add_run_parameters(ap)
    a = ap.parse_args([])
    for p in parameters.PARAMETERS:
        if p.cli:
            want = p.default if p.cli_default is None else p.cli_default
            assert getattr(a, p.name) == want, p.name
    a = ap.parse_args(["-q", "--mlock-non-expert", "--lookahead-call", "fadvise", "-n", "7",
                       "--lru-budget-mb", "300", "--lookahead-base", "pread+madvise"])
    assert (a.log_experts, a.mlock_non_expert, a.lookahead_call, a.tokens, a.lru_budget_mb,
            a.lookahead_base) == (False, True, "fadvise", 7, 300, "pread+madvise")
    for bad in (["--lookahead-call", "mmap"], ["--lookahead-base", "lookahead"]):
        with pytest.raises(SystemExit):
            ap.parse_args(bad)


def test_the_runs_table_has_every_declared_column_and_every_parameter():
    table = run_table.runs_table(sorted(REFERENCE_RUNS.glob("lookahead@*/rep1/run.json")))
    assert list(table.columns) == run_table.RUN_FIELDS
    assert set(parameters.RUN_KEYS) <= set(table.columns)
    assert (table.lookahead_base == "madvise").all() and (table.lookahead_experts == 12).all()
    assert len(set(run_table.RUN_FIELDS)) == len(run_table.RUN_FIELDS)


def test_run_rows_reproduce_the_reference_runs_table():
    """Every column's value, recomputed from the committed reference's records, is the value
    its runs.csv holds (the columns both have; the run's record path aside)."""
    runs = ROOT / "reference/vm-2026-12-06/results/runs"
    committed = pd.read_csv(runs.parent / "final/runs.csv")
    paths = sorted(runs.glob("*/rep1/run.json"))[::5]
    assert len(paths) >= 3
    for path in paths:
        row = run_table.run_row(path)
        want = committed[(committed.run_id == row["run_id"]) & (committed.repeat == 1)
                         & ~committed.rerun.astype(bool)].iloc[0]
        for col in set(row) & set(committed.columns) - {"record"}:
            got, exp = row[col], want[col]
            if isinstance(got, (int, float)) and not isinstance(got, bool) and pd.notna(exp):
                assert got == pytest.approx(float(exp), rel=1e-6, abs=1e-12), (path, col)
            else:
                assert pd.isna(exp) if got is None or got != got else str(got) == str(exp), \
                    (path, col, got, exp)


def test_a_lookahead_is_costed_by_the_read_path_of_its_base():
    rows = pd.DataFrame([{"mechanism": "lookahead", "lookahead_base": "pread+madvise"},
                         {"mechanism": "lookahead", "lookahead_base": "odirect-cache"},
                         {"mechanism": "lookahead", "lookahead_base": float("nan")},
                         {"mechanism": "madvise"}])
    assert [floors.read_path_of(r) for _, r in rows.iterrows()] == \
        ["buffered read", "O_DIRECT", "fault", "fault"]
    assert read_path("lookahead") == read_path(P["lookahead_base"].default)


def test_cpu_steal_is_a_share_of_the_machines_cpus():
    runs = pd.DataFrame({"cpu_steal_s": [3.0, 3.0], "run_wall_s": [10.0, 10.0],
                         "machine_cpus": [2, 8]})
    # 3 s of 20 CPU-seconds is over the bound; of 80 it is not
    assert list(flags.flag_reason(runs)) == ["CPU steal", ""]
