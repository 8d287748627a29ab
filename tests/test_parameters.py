"""Every place that names a run parameter agrees with harness.parameters, the one declaration."""

import argparse
import dataclasses
from pathlib import Path

import pytest
import yaml

from harness import parameters
from harness.__main__ import add_run_parameters
from harness.config import RunSpec, adhoc_spec
from harness.contract import WorkerParams
from harness.run.mechanisms import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
P = parameters.BY_NAME


def test_the_schema_declares_exactly_the_registry_with_its_defaults_and_bounds():
    experiments = SCHEMA["properties"]["experiments"]["additionalProperties"]["properties"]
    assert set(experiments) == set(parameters.RUN_KEYS)
    defaults = SCHEMA["properties"]["defaults"]["properties"]
    assert set(defaults) == {p.name for p in parameters.PARAMETERS if p.default is not None}
    for name, entry in defaults.items():
        p = P[name]
        assert entry["default"] == p.default, name
        if name != "lookahead_base":  # its values are the base mechanisms (below)
            assert entry.get("enum") == (list(p.choices) or None), name
        assert entry.get("minimum", entry.get("exclusiveMinimum")) == p.minimum, name
        assert entry.get("maximum") == p.maximum, name
    # listing values: exactly the sweepable parameters accept an array
    for name, entry in experiments.items():
        kinds = entry.get("type") or [t["type"] for t in entry["anyOf"]]
        assert ("array" in kinds) == P[name].sweepable, name
    assert set(defaults["lookahead_base"]["enum"]) == set(REGISTRY) - {"lookahead"}


def test_each_mechanism_takes_the_options_declared_for_it():
    for name, cls in REGISTRY.items():
        assert cls.options == parameters.options_of(name), name
        # and its constructor accepts them
        import inspect
        sig = inspect.signature(cls.__init__).parameters
        assert all(o in sig for o in cls.options), (name, cls.options)
    assert set().union(*(p.mechanisms for p in parameters.PARAMETERS)) <= set(REGISTRY)


def test_runspec_and_the_worker_carry_the_registry_with_its_defaults():
    fields = {f.name: f for f in dataclasses.fields(RunSpec)}
    assert set(parameters.RUN_KEYS) <= set(fields)
    for name, f in fields.items():
        if name in P and f.default is not dataclasses.MISSING:
            assert f.default == P[name].default, name
    worker = {f.name for f in dataclasses.fields(WorkerParams)}
    assert set(parameters.WORKER_KEYS) <= worker
    spec = adhoc_spec("x", "m", "lookahead")
    for p in parameters.PARAMETERS:
        if p.default is not None and p.name not in ("repeats",):
            assert spec[p.name] == p.default, p.name
    assert set(spec["mechanism_options"]) == set(parameters.options_of("lookahead"))


def test_the_command_line_has_each_declared_flag_with_its_default():
    ap = argparse.ArgumentParser()
    add_run_parameters(ap)
    a = ap.parse_args([])
    for p in parameters.PARAMETERS:
        if p.cli and p.name not in ("mechanism", "threads"):
            assert getattr(a, p.name) == p.default, p.name
    a = ap.parse_args(["-q", "--mlock-non-expert", "--lookahead-call", "fadvise", "-n", "7",
                       "--lru-budget-mb", "300"])
    assert (a.log_experts, a.mlock_non_expert, a.lookahead_call, a.tokens, a.lru_budget_mb) == \
        (False, True, "fadvise", 7, 300)
    with pytest.raises(SystemExit):
        ap.parse_args(["--lookahead-call", "mmap"])  # not an allowed value


def test_config_readme_carries_the_registry_table():
    text = (ROOT / "config/README.md").read_text()
    assert parameters.markdown_table() in text, (
        "config/README.md's key table differs from harness.parameters: paste the output of "
        "`python -m harness.parameters`")
