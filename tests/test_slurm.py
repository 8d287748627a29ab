"""The study through Snakemake's SLURM executor on a real one-node cluster (tests/slurm_cluster.py).

The `.test` configuration names two machines (config `machines:`): the cluster's node, through
profiles/slurm with the cluster section a user would write (the node to measure on, a node-local
directory for the models), and this machine without a profile. `python -m harness.fleet` runs
both, then results/compare. Checked: every run the configuration expands to has its record on the
node, each record names the SLURM job it ran in (a job sacct knows, on the configured node, in the
cluster's partition) and the staged model it measured, the measurement jobs were exclusive, and
the comparison has both machines beside the committed reference. Without the Debian packages this
fails, naming them: CI installs them.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from harness.config import check
from tests.slurm_cluster import MARKER, PARTITION, Cluster, stale_test_link

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "reference/vm-2026-12-04c/results"


def test_only_a_link_a_killed_test_cluster_left_is_taken_over(tmp_path):
    """The cluster replaces /etc/slurm/slurm.conf only where a killed test run left its link."""
    link, conf = tmp_path / "slurm.conf", tmp_path / "target.conf"
    link.symlink_to(conf)
    assert stale_test_link(link)  # dangling
    gone = subprocess.Popen(["true"])
    gone.wait()
    conf.write_text(f"{MARKER}{gone.pid}\nClusterName=x\n")
    assert stale_test_link(link)  # its owner has exited
    conf.write_text(f"{MARKER}{os.getpid()}\nClusterName=x\n")
    assert not stale_test_link(link)  # a cluster that is up
    conf.write_text("ClusterName=site\n")
    assert not stale_test_link(link)  # the machine's own SLURM, linked from elsewhere
    link.unlink()
    link.write_text("ClusterName=site\n")
    assert not stale_test_link(link)  # a file of the machine's own


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture(scope="module")
def cluster_run(cluster, tmp_path_factory):
    """(the study's directory, the node machine's own directory, the config, the node-local
    directory, the node machine's Snakemake log)."""
    wd = tmp_path_factory.mktemp("slurm-run")
    shutil.copytree(ROOT / ".test" / "config", wd / "config")
    cfg_path = wd / "config" / "experiments.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    local = wd.parent / (wd.name + "-node-local")
    cfg["machines"] = {
        # a test cluster answers at once; a real one is polled from 40 s on
        "slurm-node": {"profile": "profiles/slurm", "cluster": {"node": cluster.node, "local_dir": str(local)},
                       "args": ["--slurm-init-seconds-before-status-checks", "2"]},
        "this-machine": {},
    }
    cfg["compare"] = {"vm-2026-12-04c": str(ROOT / REFERENCE)}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    bin_dir = Path(sys.executable).parent
    env = dict(cluster.env(), PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    res = subprocess.run([sys.executable, "-m", "harness.fleet", "--directory", str(wd)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    node = wd / "machines" / "slurm-node"
    logs = {p.name: p.read_text()[-4000:] for p in wd.glob("machines/**/*.log") if p.parent.name != "logs"}
    assert res.returncode == 0, (res.stderr[-3000:] + str(logs)
                                 + "\nslurmctld:\n" + cluster.log_tail("slurmctld"))
    machine_cfg = yaml.safe_load((node / "config/experiments.yaml").read_text())
    return wd, node, machine_cfg, local, (node / "snakemake.log").read_text()


def test_every_run_has_a_record_naming_its_slurm_job(cluster, cluster_run):
    _, wd, cfg, local, _ = cluster_run
    assert cfg["cluster"]["node"] == cluster.node  # the machine's own cluster section
    expected = {(r.run_id, k) for r in check(cfg) for k in range(1, r.repeats + 1)}
    runs = pd.read_csv(wd / "results/final/runs.csv")
    assert set(zip(runs.run_id, runs.repeat)) == expected
    jobs = {}
    for run_id, k in expected:
        rec = json.loads((wd / f"results/runs/{run_id}/rep{k}/run.json").read_text())
        m = rec["machine"]
        assert m["slurm_node"] == cluster.node and m["slurm_partition"] == PARTITION, m
        assert m["slurm_job_id"] and m["slurm_job_id"] not in jobs.values(), m
        jobs[(run_id, k)] = m["slurm_job_id"]
        # measured from the node-local copy, which is the same file as the shared one
        assert Path(rec["model"]["path"]).parent == local, rec["model"]
        assert rec["model"]["staged_from"] == str(wd / "results/models" / Path(rec["model"]["path"]).name)
        assert rec["model_unchanged"]
    # sacct knows each of those jobs, ran it on the configured node, and it had the node to itself
    out = cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,NodeList,State,Partition",
                      "-j", ",".join(sorted(set(jobs.values()))))
    rows = [line.split("|") for line in out.splitlines() if line]
    assert {r[0] for r in rows} == set(jobs.values())
    assert all(r[1] == cluster.node and r[2] == "COMPLETED" and r[3] == PARTITION for r in rows)
    # slurmctld still holds finished jobs (MinJobAge 600 s): each run's job was exclusive
    # (a job submitted without --exclusive shows OverSubscribe=OK)
    for job in sorted(set(jobs.values())):
        shown = cluster.run("scontrol", "-o", "show", "job", job)
        assert "OverSubscribe=NO" in shown, shown


def test_machines_compare_side_by_side_with_a_tree_brought_back(cluster, cluster_run):
    wd, _, _, _, _ = cluster_run
    for name in ("slurm-node", "this-machine"):  # each machine its own tree and report
        assert (wd / "machines" / name / "results/final/RESULTS.md").exists(), name
    assert not (wd / "results/final").exists()  # the study directory itself measured nothing
    text = (wd / "results/compare/COMPARE.md").read_text()
    machines = pd.read_csv(wd / "results/compare/machines.csv").set_index("fact")
    assert list(machines.columns) == ["vm-2026-12-04c", "slurm-node", "this-machine"]
    assert machines.loc["slurm_partition", "slurm-node"] == PARTITION
    assert pd.isna(machines.loc["slurm_partition"].get("this-machine"))
    # every configuration of the .test study, measured on both machines, with its range and n
    configs = pd.read_csv(wd / "results/compare/configurations.csv").set_index("run_id")
    ran = configs[configs["slurm-node tok/s"] != "not run"]
    assert set(ran.index) == set(pd.read_csv(wd / "machines/slurm-node/results/final/runs.csv").run_id)
    for name in ("slurm-node", "this-machine"):
        assert ran[f"{name} tok/s"].str.contains(r"\(.*n=\d").all(), ran[f"{name} tok/s"]
    verdicts = pd.read_csv(wd / "results/compare/verdicts.csv")
    judged = verdicts[verdicts["slurm-node"].notna()]
    assert len(judged) and judged["this-machine"].notna().all(), verdicts
    links = re.findall(r"\]\(([^)]+run\.json)\)", text)
    for name in ("slurm-node", "this-machine"):
        assert any(f"machines/{name}/results/runs/" in str((wd / "results/compare" / u).resolve())
                   for u in links), name
    for link in links:
        assert (wd / "results/compare" / link).resolve().exists(), link


def test_cheap_rules_ran_locally_and_measurements_as_jobs(cluster_run):
    _, _, _, _, log = cluster_run
    # "Job 4 has been submitted with SLURM jobid 1 (log: .../slurm_logs/rule_build_llama/1.log)"
    submitted = set(re.findall(r"has been submitted with SLURM jobid \d+ \(log: \S*/rule_(\w+)/", log))
    local = set(re.findall(r"^localrule (\w+):", log, re.M))
    assert {"build_llama", "cpu_quota", "io_ceiling", "compute_ceiling", "stock_baseline",
            "harness_run_rep1", "harness_run_rep2"} <= submitted, submitted
    assert {"runs_table", "findings", "final", "layout"} <= local, local
    assert not local & submitted
