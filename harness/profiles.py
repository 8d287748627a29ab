"""A machine profile as the measurements apply it: the Limits the supervisor puts a run (or a
ceiling) under, a limit's value from the config, the quota the calibration left, and the part
of the config a measurement rule's params carry (so editing anything else re-measures nothing).
The profile's keys are declared in harness.profile_keys; the config's checks are harness.config's.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import profile_keys
from harness.config import parse_size, study_profiles
from harness.util import canonical


def profile_limits(config: dict, device_path: str, *, ram: bool = True, cpu_quota: float | None = None,
                   profile: str | None = None):
    """The Limits of a machine profile (default: the study's first; ram=False: no RAM budget).
    cpu_quota: the profile's CPU quota in CPUs, as calibrated (harness.stages.calibrate) or given in the
    profile."""
    from harness.box.limits import Limits

    name = profile or study_profiles(config)[0]
    prof = config["profiles"][name]
    values = {k.limit: limit_value(k, prof.get(k.name), f"profiles.{name}.{k.name}")
              for k in profile_keys.LIMITS}
    # the quota is the calibrated one (or the profile's, as the caller read it)
    values.update(cpu_quota=cpu_quota, **({} if ram else {"ram_bytes": None}))
    return Limits(**values, device_path=device_path,
                  allow_unenforced=bool(prof.get("allow_unenforced", False)))


def limit_value(key: profile_keys.ProfileKey, value, where: str):
    """A limit's value as Limits holds it: a size in bytes, a number as it is; None for none."""
    if value is None:
        return None
    return parse_size(value, where) if key.kind == profile_keys.SIZE else value


def profile_config(config: dict, name: str) -> dict:
    """Only that profile, as a measurement rule's params carry it: editing experiments, another
    profile or how this one is read must not re-trigger its ceilings or finished runs through
    Snakemake's params."""
    # the keys that say how results are read (and the run parameters its runs default to, which
    # each run's own params carry, resolved) are left out: editing them re-measures nothing
    prof = {k: v for k, v in config["profiles"][name].items()
            if k not in profile_keys.READING_KEYS}
    return canonical({"profile": name, "profiles": {name: prof}})


def cpu_quota_of(quota_json: str | None) -> float | None:
    """The CPU quota in force (CPUs) from the cpu_quota rule's output."""
    if not quota_json:
        return None
    return json.loads(Path(quota_json).read_text()).get("cpu_quota")
