"""What RESULTS.md is rendered from: the findings rule's inputs, loaded once (the runs table, the
records, the models' layouts), and one regime's share of them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import parameters
from harness.analysis import configurations, flags
from harness.record import read_run


@dataclass(frozen=True)
class ReportInputs:
    """The findings rule's inputs, by name (the script converts Snakemake's lists into this)."""

    runs: str
    records: list
    io: list
    compute: list
    baselines: list
    layouts: list
    infos: list
    quota: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, named) -> ReportInputs:
        """From Snakemake's named input list (or any mapping of name -> path or paths)."""
        items = dict(named.items()) if hasattr(named, "items") else dict(named)
        return cls(**{k: v if isinstance(v, str) else [str(x) for x in v]
                      for k, v in items.items() if k in {f.name for f in dataclasses.fields(cls)}})


@dataclass(frozen=True)
class RegimeInputs:
    """One regime's ceilings, quota and stock baselines."""

    io: str
    compute: str
    quota: str | None
    baselines: list


@dataclass
class Loaded:
    """What every section reads: the runs (all, and the default length the findings compare), the
    models' metadata and layouts, the records, the configured pair of quants."""

    config: dict
    all_runs: pd.DataFrame
    runs: pd.DataFrame
    layouts: dict
    infos: dict
    records: list
    limits: dict
    any_synth: bool
    q4: str
    q2: str


def load(inputs: ReportInputs, config: dict) -> Loaded:
    all_runs = pd.read_csv(inputs.runs)
    # Speed findings compare each configuration at its regime's common length
    # (configurations.at_study_length); a longer run beside it (the routing trace) feeds the routing
    # findings and the table of every configuration, not the comparisons.
    layouts = {Path(p).name.removesuffix(".layout.json"): json.loads(Path(p).read_text())
               for p in inputs.layouts}
    infos = {Path(p).name.removesuffix(".json"): json.loads(Path(p).read_text()) for p in inputs.infos}
    records = [read_run(p) for p in inputs.records]
    q4, q2 = pair_models(config)
    if "disturbed" not in all_runs:  # runs.csv has carried it since format 2 of the run record
        all_runs["disturbed"] = flags.disturbed(all_runs)
    for name in parameters.RENAMED_VALUES:  # a runs.csv written before a value was renamed
        if name in all_runs:
            all_runs[name] = all_runs[name].map(lambda v: parameters.current_value(name, v))
    # the findings judge only repeats nothing else disturbed (RESULTS.md lists the others)
    judged = all_runs[configurations.at_study_length(all_runs) & ~all_runs.disturbed]
    return Loaded(config=config, all_runs=all_runs, runs=judged,
                  layouts=layouts, infos=infos, records=records,
                  limits=records[0].limits_in_force if records else {},
                  any_synth=any(i.get("synthetic") for i in infos.values()), q4=q4, q2=q2)


def regime_of(d: Loaded, inputs: ReportInputs, name: str, i: int, several: bool):
    """One regime's runs, records and ceilings, as the single-regime sections read them (the
    rules name ceilings per profile, so even a one-profile study gets lists of one)."""
    if several:
        runs = d.all_runs[d.all_runs.profile == name]
        records = [r for r in d.records if r.spec.profile == name]
        d = dataclasses.replace(d, all_runs=runs, runs=d.runs[d.runs.profile == name],
                                records=records,
                                limits=records[0].limits_in_force if records else {})
    return d, RegimeInputs(
        io=inputs.io[i], compute=inputs.compute[i],
        quota=inputs.quota[i] if inputs.quota else None,
        baselines=[b for b in inputs.baselines if not several or f"/baselines/{name}/" in b])


def pair_models(config: dict) -> tuple[str, str]:
    """The Q4_K_M and Q2_K models of the study's pair (by quant), falling back to config order."""
    by_quant = {m.get("quant"): name for name, m in config["models"].items()}
    return by_quant.get("Q4_K_M", config["ceilings"]["moe_model"]), by_quant.get("Q2_K", "")
