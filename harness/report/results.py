"""RESULTS.md, its tables and plots, rendered from the run records: `write_findings` runs the
sections (harness.report.sections) over what harness.report.inputs loads, regime by regime.

Every number in RESULTS.md is printed from a CSV under tables/ (rounded there first, so the text
and the CSV hold the same digits), and every section names the CSV and the rule that made it.
"""

from __future__ import annotations

import logging
from pathlib import Path


from harness.analysis import breakdown, findings, limit, policies, stats, tables
from harness.report.inputs import ReportInputs, load, regime_of
from harness.report.sections import (attribution_section, breakdown_section, ceilings_section,
                                     closing_section, configurations_section, design_section,
                                     distance_section, drift_power_section,
                                     findings_section, header_section, later_section,
                                     policies_section)
from harness.report.writer import Writer

log = logging.getLogger(__name__)

__all__ = ["ReportInputs", "write_findings"]


def write_findings(inputs: ReportInputs, outputs: dict, config: dict) -> None:
    """RESULTS.md with its tables and plots, section by section; in a study of several regimes
    (profiles), the sections from the ceilings to the findings once per regime, then every
    finding's verdicts side by side. `outputs`: `results`, `tables`, `plots` paths."""
    from harness.config import study_profiles
    from harness.report.compare import TABLES

    d = load(inputs, config)
    w = Writer(Path(outputs["tables"]), Path(outputs["plots"]))
    w.unenforced.update(tables.unenforced_runs(d.all_runs))
    header_section(w, d)
    attribution_section(w, d)
    names = study_profiles(config)
    verdicts_by: dict[str, list[dict]] = {}
    for i, name in enumerate(names):
        sub, sub_inputs = regime_of(d, inputs, name, i, several=len(names) > 1)
        rw = w
        if len(names) > 1:
            rw = w.regime(name)
            rw.text(f"# Regime: {name}\n")
            rw.text(f"{config['profiles'][name].get('description', '')}\n")
        ceil = ceilings_section(rw, sub, sub_inputs)
        summ = configurations_section(rw, sub, sub_inputs)
        distance_section(rw, limit.distance_to_limit(
            summ, sub.all_runs, sub.layouts,
            limit.Ceilings(ceil.io_by_path, ceil.moe_ceiling, sub.limits)), ceil, sub.limits)
        later_section(rw, sub.all_runs)
        drift_power_section(rw, sub.all_runs)
        effect = config["profiles"][name].get("min_effect")
        rw.text(f"Minimum effect of a directional verdict in this regime: "
                f"{stats.MIN_EFFECT if effect is None else effect:.0%}"
                + (" (the profile's `min_effect`: the study's design cannot resolve "
                   f"{stats.MIN_EFFECT:.0%} here with the runs it can afford; README "
                   "\"Design\")" if effect is not None and effect != stats.MIN_EFFECT else "")
                + ".\n")
        study = findings.Study.of(sub.runs, sub.all_runs, sub.layouts, sub.q4, sub.q2,
                                  ceil.io_mb_s_median, ceil.compute_row("dense warm"),
                                  ceil.moe_ceiling.get(sub.q4, float("nan")), effect,
                                  ceil.dense_warm_samples)
        verdicts_by[name] = findings_section(rw, study)
        design_section(rw, study)
        policies_section(rw, policies.policy_study(sub.runs, sub.layouts, sub.limits.get("ram_bytes")))
        breakdown_section(rw, breakdown.time_breakdown(sub.runs, summ))
    closing_section(w, d, verdicts_by)
    w.write_whole(TABLES)
    out_md = Path(outputs["results"])
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(w.parts))
    log.info(f"wrote {out_md}")
