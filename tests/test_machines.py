"""harness.fleet: the config each machine runs, the commands, the comparison's columns. The
driver's real run (a cluster node and this machine, then results/compare) is in test_slurm.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import fleet as hm

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def study(tmp_path):
    cfg = yaml.safe_load((ROOT / ".test/config/experiments.yaml").read_text())
    cfg["compare"] = {"reference": "reference/vm-2026-12-04c/results"}
    cfg["cluster"] = {"node": None, "partition": None, "local_dir": None}
    cfg["machines"] = {
        "node-a": {"profile": "profiles/slurm", "args": ["--slurm-init-seconds-before-status-checks", "2"],
                   "cluster": {"node": "node-a", "partition": "debug", "local_dir": "/scratch/moe"}},
        "here": {},
    }
    (tmp_path / "config").mkdir()
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path, cfg


def test_each_machine_runs_the_study_with_its_own_cluster_section(study):
    wd, cfg = study
    path = hm.prepare(wd, cfg, "node-a")
    assert path == wd / "machines/node-a/config/experiments.yaml"
    written = yaml.safe_load(path.read_text())
    assert written["cluster"] == {"node": "node-a", "partition": "debug", "local_dir": "/scratch/moe"}
    assert "machines" not in written and "compare" not in written
    assert written["experiments"] == cfg["experiments"] and written["models"] == cfg["models"]
    assert yaml.safe_load(hm.prepare(wd, cfg, "here").read_text())["cluster"] == {}
    mtime = path.stat().st_mtime_ns
    hm.prepare(wd, cfg, "node-a")  # unchanged: not rewritten
    assert path.stat().st_mtime_ns == mtime


def test_commands_name_the_machine_directory_profile_and_args(study):
    wd, cfg = study
    node = hm.snakemake_argv(wd, cfg, "node-a", "results/final", False)
    assert node[:3] == [sys.executable, "-m", "snakemake"]
    assert node[node.index("--directory") + 1] == str(wd / "machines/node-a")
    assert node[node.index("--profile") + 1] == str(ROOT / "profiles/slurm")  # the checkout's
    assert node[-3:] == ["--slurm-init-seconds-before-status-checks", "2", "results/final"]
    here = hm.snakemake_argv(wd, cfg, "here", "results/final", True)
    assert "--profile" not in here and here[here.index("--cores") + 1] == "all"
    assert here[-2:] == ["-n", "results/final"]


def test_the_comparison_has_the_compare_trees_then_every_machine(study):
    _, cfg = study
    assert hm.compare_trees(cfg) == {"reference": "reference/vm-2026-12-04c/results",
                                     "node-a": "machines/node-a/results",
                                     "here": "machines/here/results"}
    assert hm.compare_trees({"compare": {"x": "results"}}) == {"x": "results"}


@pytest.mark.parametrize("machines,needle", [
    ({"a b": {}}, "not a usable name"), ({"reference": {}}, "also a tree under compare"),
    ({"x": "profiles/slurm"}, "expected a mapping")])
def test_bad_machines_are_refused_by_name(study, machines, needle):
    _, cfg = study
    with pytest.raises(hm.MachinesError, match=needle):
        hm.compare_trees({**cfg, "machines": machines})


def test_a_profile_that_does_not_exist_is_refused(study):
    wd, cfg = study
    cfg["machines"]["node-a"]["profile"] = "profiles/nowhere"
    with pytest.raises(hm.MachinesError, match="profiles/nowhere"):
        hm.snakemake_argv(wd, cfg, "node-a", "results/final", False)


def test_driver_refuses_an_unknown_machine_and_a_config_without_machines(study, tmp_path_factory):
    wd, cfg = study
    res = subprocess.run([sys.executable, "-m", "harness.fleet", "--directory", str(wd), "nope"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "no machine named nope" in res.stderr
    bare = tmp_path_factory.mktemp("bare")
    (bare / "config").mkdir()
    (bare / "config/experiments.yaml").write_text(yaml.safe_dump({**cfg, "machines": {}}))
    res = subprocess.run([sys.executable, "-m", "harness.fleet", "--directory", str(bare)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "no machines: to run" in res.stderr


def test_dry_run_plans_every_machine_and_the_schema_takes_machines(study):
    """Each machine's Snakemake plans the whole study in its own directory (the config, machines
    section included, passes the schema); a dry run compares nothing."""
    wd, _ = study
    res = subprocess.run([sys.executable, "-m", "harness.fleet", "--directory", str(wd), "-n",
                          "here"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    plan = (wd / "machines/here/snakemake.log").read_text()
    assert "harness_run_rep1" in plan and "final" in plan, plan[-2000:]
    assert not (wd / "machines/compare.log").exists()
    top = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--directory", str(wd), "-n", "results/compare"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    # the machines' trees are not there: the comparison names what is missing, runs nothing
    assert top.returncode != 0 and "machines/here/results/final/runs.csv" in top.stdout + top.stderr


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c["machines"]["here"].update(profil="profiles/slurm"), "profil"),
    (lambda c: c["experiments"]["baseline"].update(tokens=0), "tokens"),
], ids=["typo in a machine's key", "bad experiment"])
def test_the_driver_validates_the_whole_config_before_any_machine_runs(study, mutate, needle):
    wd, cfg = study
    mutate(cfg)
    (wd / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "harness.fleet", "--directory", str(wd)],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and needle in res.stderr, res.stderr[-2000:]
    assert not (wd / "machines").exists()  # nothing was prepared, nothing ran
