"""harness.record: every record type written and read back, format 1 converted, a newer format
or an unknown field refused with a message that names it, and the reference page current."""

import dataclasses
import json
from pathlib import Path

import pytest

from harness import docs, record
from harness.analysis import run_table
from harness.record import Moment, ModelRef, RecordError, RunRecord, Spec, WorkerSummary

ROOT = Path(__file__).resolve().parents[1]


def full_record() -> RunRecord:
    return RunRecord(
        run_id="pread-madvise@seed-box",
        spec=Spec(run_id="pread-madvise@seed-box", entry="pread-madvise", model="olmoe-q4",
                  mechanism="pread+madvise", threads=2, tokens=6, repeat=2, rerun=True,
                  profile="seed-box", mechanism_options={}),
        status="ok", start_utc="2026-12-04T09:00:00.000+00:00", end_utc="2026-12-04T09:01:00",
        wall_s=60.5, exit_code=0, tokens_completed=6, residency_at_start=0.0,
        cgroup_io_bytes={"read": 1000, "write": 0},
        box={"counters_delta": {"cpu_s": {"steal": 0.25}, "device": {"read_bytes": 1500}},
             "thp": {"enabled": "madvise"}, "damon": [], "damon_applied_during_run": {}},
        summary=WorkerSummary(tokens_completed=6, prompt_tokens=[1, 2], generated_tokens=[3] * 6,
                              model_moments={"before_first_decode": {
                                  "residency": 0.4, "cgroup_read_bytes": 10, "t_unix": 1.0}},
                              byte_accounting_ok=True),
        limits_in_force={"ram_bytes": 1825361100, "cpu_quota": 0.085, "read_ahead_kb": 128},
        model=ModelRef(name="olmoe-q4", quant="Q4_K_M", synthetic=True),
        build={"commit": "0c1e570", "file_advice": {"posix_fadvise": ["SEQUENTIAL"]}},
        machine={"hostname": "vm", "cores": 2})


def test_a_record_of_every_type_writes_and_reads_back_equal(tmp_path):
    rec = full_record()
    record.write_run(tmp_path / "run.json", rec)
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert on_disk["format"] == record.FORMAT_VERSION
    back = record.read_run(tmp_path / "run.json")
    assert back == rec
    assert isinstance(back.spec, Spec) and isinstance(back.summary, WorkerSummary)
    assert isinstance(back.model, ModelRef)
    assert back.summary.moment("before_first_decode") == Moment(0.4, 10, 1.0)
    assert back.summary.moment("after_load") is None
    # what the analysis reads from the record's dicts
    assert (back.cpu_steal_s, back.device_read_bytes, back.cgroup_read_bytes) == (0.25, 1500, 1000)
    assert back.limit("cpu_quota") == 0.085 and back.limit("write_bps") is None
    assert back.limits_enforced and back.file_advice == ["SEQUENTIAL"]
    assert back.thp == {"enabled": "madvise"}


def test_format_1_is_converted_and_takes_the_not_recorded_values(tmp_path):
    # a record as the code wrote it before the format existed: no `format`, no `rerun` in its
    # spec, a summary of a run killed before the worker could write one
    v1 = {"run_id": "baseline", "status": "killed: time",
          "spec": {"run_id": "baseline", "entry": "baseline", "model": "olmoe-q4",
                   "mechanism": "none", "repeat": 1},
          "summary": {}, "limits_in_force": None, "wall_s": 12.0}
    (tmp_path / "run.json").write_text(json.dumps(v1))
    rec = record.read_run(tmp_path / "run.json")
    assert rec.format == record.FORMAT_VERSION and rec.spec.rerun is False
    assert rec.summary == WorkerSummary() and rec.limits_in_force == {}
    assert rec.spec.tokens == 32 and rec.spec.lookahead_call == "madvise"  # the registry's defaults
    # ... but for a default that changed since: every such run waited as libgomp does
    assert rec.spec.omp_wait_policy == "libgomp"


def test_format_2_reads_renamed_values_under_their_new_names():
    base = dataclasses.asdict(full_record())
    v2 = {**base, "format": 2, "spec": {**base["spec"], "omp_wait_policy": "default"}}
    assert record.from_dict(v2).spec.omp_wait_policy == "libgomp"
    v2["spec"]["omp_wait_policy"] = "passive"
    assert record.from_dict(v2).spec.omp_wait_policy == "passive"
    del v2["spec"]["omp_wait_policy"]
    assert record.from_dict(v2).spec.omp_wait_policy == "libgomp"
    # the current format is read as written: a missing key takes the registry's default
    v3 = {**base, "spec": {k: v for k, v in base["spec"].items() if k != "omp_wait_policy"}}
    assert record.from_dict(v3).spec.omp_wait_policy == "auto"


def test_a_newer_format_or_an_unknown_field_is_refused_naming_it(tmp_path):
    base = dataclasses.asdict(full_record())
    newer = record.FORMAT_VERSION + 1
    with pytest.raises(RecordError, match=rf"format {newer} is newer .*formats 1 to {record.FORMAT_VERSION}"):
        record.from_dict({**base, "format": newer})
    with pytest.raises(RecordError, match="does not know: gpu_watts"):
        record.from_dict({**base, "gpu_watts": 12})
    with pytest.raises(RecordError, match="summary: .*does not know: tflops"):
        record.from_dict({**base, "summary": {"tflops": 1}})


def test_the_reference_page_documents_every_field_with_its_unit():
    page = (ROOT / "docs/run-record.md").read_text()
    assert page == docs.run_record_page(), "docs/run-record.md is stale: python -m harness.docs"
    # the page is made from the declarations: what can go wrong is a field declared without its
    # sentence
    for cls in (RunRecord, Spec, WorkerSummary, Moment, ModelRef):
        for fld in dataclasses.fields(cls):
            assert fld.metadata.get("doc"), (cls.__name__, fld.name)
    assert all(c.doc for c in record.TOKEN_COLUMNS) and all(c.doc for c in run_table.RUN_COLUMNS)


def test_the_worker_writes_the_declared_token_columns():
    import dataclasses

    from harness.box import counters
    from harness.run import worker

    row = {f: 0 for f in record.TOKEN_FIELDS}
    assert worker.token_line(row).count(",") == len(record.TOKEN_FIELDS) - 1
    with pytest.raises(worker.WorkerError, match=r"undeclared \['gpu_s'\]"):
        worker.token_line({**row, "gpu_s": 1.0})  # an undeclared column is not lost silently
    with pytest.raises(worker.WorkerError, match=r"missing \['wall_s'\]"):
        worker.token_line({k: v for k, v in row.items() if k != "wall_s"})
    # every part the counters give a token is a declared column (a new part must be declared)
    snap = counters.Snapshot(**{f.name: 1 for f in dataclasses.fields(counters.Snapshot)})
    part_keys = set(counters.parts(snap, snap, 1.0))
    assert part_keys <= set(record.TOKEN_FIELDS), part_keys - set(record.TOKEN_FIELDS)
    assert {"io_wait_s", "sync_wait_s", "identity_ok"} <= part_keys and "harness_s" not in part_keys
