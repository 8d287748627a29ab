"""The experiments config: checks beyond the JSON schema, and expansion of entries into runs.

An experiment entry may list values for a key (`model: [olmoe-q4, olmoe-q2]`,
`lru_budget_mb: [0, 256]`); it expands to one run per combination with readable run ids:
`<entry>` alone when nothing is listed, otherwise `<entry>--<key>-<value>` parts in key order.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import yaml

from harness import bounds, catalog, parameters, profile_keys

SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*$")
UNITS = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
         "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
# the run parameters (names, types, defaults, which mechanisms read them) are harness.parameters'
SWEEPABLE, MECHANISM_DEFAULTS = parameters.SWEEPABLE, parameters.MECHANISM_DEFAULTS
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
# a model's or a profile's name becomes a path under results/ and part of run ids: no `/`, no
# leading `.`, nothing a shell would read
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
# a SLURM node or partition name, as sbatch --nodelist / --partition take one
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ConfigError(ValueError):
    pass


def parse_size(value, where: str) -> int:
    """Bytes from 1536, '150MB', '1.5GiB'. Negative or unparseable sizes are errors."""
    if isinstance(value, bool):
        raise ConfigError(f"config: {where}: {value!r} is not a size")
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(f"config: {where}: {value} is negative")
        return int(value)
    m = SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"config: {where}: {value!r} is not a size (like 1536, '150MB', '1.5GiB')")
    unit = m.group(2).lower() if m.group(2) else None
    return int(float(m.group(1)) * UNITS[unit])


def _as_dict(self) -> dict:
    d = dict(self.__dict__)
    # each mechanism declares the keys it takes; only those reach it
    d["mechanism_options"] = {k: d[k] for k in parameters.options_of(self.mechanism)}
    return d


def _spec_field(p: parameters.Parameter):
    return (p.name, p.type) if p.default is None else \
        (p.name, p.type, dataclasses.field(default=p.default))


# One run's configuration: its id, its entry, every run parameter of harness.parameters (with its
# declared default) and the profile (regime) it is measured under. Derived from the registry, so
# a new parameter is here without an edit; keyword-only, so the order of the registry is free.
RunSpec = dataclasses.make_dataclass(
    "RunSpec",
    [("run_id", str), ("entry", str), *map(_spec_field, parameters.PARAMETERS),
     ("profile", str, dataclasses.field(default=""))],
    frozen=True, kw_only=True, namespace={"as_dict": _as_dict})
RunSpec.__module__ = __name__  # pickling finds it here


def adhoc_spec(run_id: str, model: str, mechanism: str, *, repeat: int = 1, **overrides) -> dict:
    """The run spec of a measurement outside the config (the CLI, benchmarks, tests): the schema's
    defaults, then `overrides` (RunSpec fields, or supervisor switches such as `warm`). The one
    constructor besides `expand`, so every spec has the same keys."""
    fields = set(RunSpec.__dataclass_fields__)
    # no profile here: the command line's defaults where they differ (threads); one repeat
    declared = {p.name: p.default if p.cli_default is None else p.cli_default
                for p in parameters.PARAMETERS if p.default is not None or p.cli_default is not None}
    base = RunSpec(run_id=run_id, entry="adhoc", **{**declared, "model": model,
                                                     "mechanism": mechanism, "repeats": 1})
    base = dataclasses.replace(base, **{k: v for k, v in overrides.items() if k in fields})
    return {**base.as_dict(), "repeat": repeat,
            **{k: v for k, v in overrides.items() if k not in fields}}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return re.sub(r"[^a-z0-9.+-]+", "-", str(v).lower()).strip("-")


def study_profiles(config: dict) -> list[str]:
    """The profiles the study runs under, in order: `profile:` names one or lists several (the
    regimes: every experiment runs under each)."""
    p = config.get("profile")
    return list(p) if isinstance(p, list) else [p]


def expand(config: dict, workdir: Path | None = None) -> list[RunSpec]:
    """Every run of every experiment under every profile of the study, in config order; raises
    ConfigError on bad entries, and on a study that measures nothing or a run id too long for the
    file system of `workdir` (default: the working directory, where Snakemake writes results/).
    With several profiles a run id ends in `@<profile>`."""
    names = study_profiles(config)
    if not config.get("experiments"):
        raise ConfigError("config: experiments: empty; the study would measure nothing (name at "
                          "least one experiment)")
    limits = bounds.name_limits(workdir or Path.cwd())
    runs: list[RunSpec] = []
    for name in names:
        mine = _expand_profile(config, name)
        if not mine:
            raise ConfigError(f"config: profile: {name!r} runs no experiment (each entry's "
                              f"{parameters.PROFILES_KEY}: leaves it out); name it in an entry's "
                              f"{parameters.PROFILES_KEY}: or take it out of profile:")
        for r in mine:
            rid = f"{r.run_id}@{name}" if len(names) > 1 else r.run_id
            why = bounds.path_problem(rid, workdir or Path.cwd(), limits)
            if why:
                raise ConfigError(f"config: experiments.{r.entry}: {why} (shorten the entry's name "
                                  "or the values it lists)")
            runs.append(dataclasses.replace(r, run_id=rid, profile=name))
    return runs


def profile_run_defaults(config: dict, profile_name: str) -> dict:
    """The run parameters a profile's runs take unless their experiment sets them: the study's
    `defaults` under the profile's `run_defaults`."""
    return {**config.get("defaults", {}),
            **(config["profiles"][profile_name].get("run_defaults") or {})}


def _expand_profile(config: dict, profile_name: str) -> list[RunSpec]:
    """The profile's runs: each experiment that runs under it, its values over the profile's
    `run_defaults` over the study's `defaults`."""
    profile = config["profiles"][profile_name]
    runs: list[RunSpec] = []
    seen: dict[str, str] = {}
    options = sorted(set(profile.get("run_defaults") or {}) & set(MECHANISM_DEFAULTS))
    if options:
        raise ConfigError(f"config: profiles.{profile_name}.run_defaults.{options[0]}: a mechanism's "
                          "option; set it on the experiments whose mechanism reads it")
    for entry, body in (config.get("experiments") or {}).items():
        if not ID_RE.match(entry):
            raise ConfigError(f"config: experiments.{entry}: names use a-z, 0-9 and . _ + -")
        body = dict(body)
        only = body.pop(parameters.PROFILES_KEY, None)
        if only is not None:
            unknown = [p for p in only if p not in config["profiles"]]
            if unknown:
                raise ConfigError(f"config: experiments.{entry}.{parameters.PROFILES_KEY}: "
                                  f"{', '.join(map(repr, unknown))} is not a profile of profiles: "
                                  f"{', '.join(config['profiles'])}")
            if profile_name not in only:
                continue
        merged = {**profile_run_defaults(config, profile_name), **body}
        merged.setdefault("threads", profile.get("threads", 2))
        listed = [k for k in SWEEPABLE if isinstance(merged.get(k), list)]
        for k, v in merged.items():
            if isinstance(v, list) and not v:
                raise ConfigError(f"config: experiments.{entry}.{k}: an empty list expands to no runs")
            if isinstance(v, list) and k not in SWEEPABLE:
                raise ConfigError(f"config: experiments.{entry}.{k}: cannot list values; only "
                                  f"{', '.join(SWEEPABLE)} can")
        for combo in itertools.product(*[merged[k] for k in listed]):
            vals = {**merged, **dict(zip(listed, combo, strict=True))}
            check_run_values(config, entry, vals, profile_name)
            parts = [entry] + [f"{k.replace('_', '-')}-{_fmt(vals[k])}" for k in listed]
            run_id = "--".join(parts)
            if run_id in seen:
                raise ConfigError(f"config: duplicate run id {run_id!r} (from experiments.{entry} and "
                                  f"experiments.{seen[run_id]})")
            seen[run_id] = entry
            declared = {p.name: vals.get(p.name, p.default) for p in parameters.PARAMETERS}
            runs.append(RunSpec(run_id=run_id, entry=entry,
                                **{k: (parameters.BY_NAME[k].type(v) if v is not None else v)
                                   for k, v in declared.items()}))
    return runs


def check_run_values(config: dict, entry: str, vals: dict, profile_name: str) -> None:
    """One run's values, on their own and against the profile it runs under (`profile_name`)."""
    where = f"config: experiments.{entry}"
    # a config the schema has not filled in (read by hand) has the declared defaults too
    vals = {**{p.name: p.default for p in parameters.PARAMETERS if p.default is not None}, **vals}
    if vals.get("model") not in config.get("models", {}):
        raise ConfigError(f"{where}.model: {vals.get('model')!r} is not one of the models: "
                          f"{', '.join(config.get('models', {}))}")
    # every parameter's type, bounds and allowed values, as declared (list items included:
    # the schema's bounds on a list hold for its items only)
    for p in parameters.PARAMETERS:
        why = parameters.problem(p, vals.get(p.name)) if vals.get(p.name) is not None else ""
        if why:
            raise ConfigError(f"{where}.{p.name}: {why}")
    if not vals["prompt"].strip():
        raise ConfigError(f"{where}.prompt: {vals.get('prompt')!r} is empty; the run decodes from a "
                          "prompt of at least one non-blank character")
    try:  # the tokenizer takes UTF-8: a lone surrogate or a NUL would fail in every run
        vals["prompt"].encode("utf-8")
        if "\0" in vals["prompt"]:
            raise UnicodeError("NUL")
    except UnicodeError:
        raise ConfigError(f"{where}.prompt: {vals['prompt']!r} is not text the tokenizer can take "
                          "(a lone surrogate or a NUL character)") from None
    if vals["tokens"] <= vals["warmup_tokens"]:
        raise ConfigError(f"{where}.tokens: {vals['tokens']} leaves no measured window after "
                          f"warmup_tokens: {vals['warmup_tokens']} (tokens must be more)")
    cpus = usable_cpus()
    if cpus and not _measured_elsewhere(config) and vals["threads"] > cpus:
        raise ConfigError(f"{where}.threads: {vals['threads']} is more than the {cpus} CPUs this "
                          "process may use (each thread would wait for a core)")
    mech = catalog.BY_NAME[vals["mechanism"]]
    options = parameters.options_of(mech.name)
    body = (config.get("experiments") or {}).get(entry) or {}
    for k in MECHANISM_DEFAULTS:
        # an option the mechanism ignores would make a duplicate measurement under a new name
        if k in body and k not in options:
            raise ConfigError(f"{where}.{k}: {vals['mechanism']} does not read {k} (its options: "
                              f"{', '.join(options) or 'none'}); remove it, or list it only "
                              "on an entry whose mechanism reads it")
    model = config["models"][vals["model"]]
    n_expert = _synthetic_experts(model)
    if n_expert == 0 and mech.prefetches:
        raise ConfigError(f"{where}: model {vals['model']!r} is dense (shape {model.get('shape')!r} "
                          f"has no experts); {vals['mechanism']} prefetches experts: use mechanism "
                          "none, or a MoE model")
    if n_expert and "lookahead_experts" in options and vals["lookahead_experts"] > n_expert:
        raise ConfigError(f"{where}.lookahead_experts: {vals['lookahead_experts']} is more than "
                          f"model {vals['model']!r}'s {n_expert} experts per layer")
    _check_memory_values(config, where, vals, options, profile_name)


def _check_memory_values(config: dict, where: str, vals: dict, options: tuple[str, ...],
                         profile_name: str) -> None:
    """Every memory-sized parameter the run reads, against what its profile's RAM budget leaves
    beside the model's non-expert tensors and the run's own buffers (harness.bounds)."""
    rb = config["profiles"][profile_name].get("ram_budget")
    if rb is None:
        return
    budget = parse_size(rb, f"profiles.{profile_name}.ram_budget")
    model = config["models"][vals["model"]]
    left = bounds.memory_left(budget, model)
    for p in parameters.PARAMETERS:
        unit = bounds.MEMORY_UNITS.get(p.unit)
        if unit is None or vals.get(p.name) is None or (p.mechanisms and p.name not in options):
            continue
        if vals[p.name] * unit > left:
            raise ConfigError(
                f"{where}.{p.name}: {vals[p.name]} {p.unit} is more than profile {profile_name}'s "
                f"ram_budget leaves a run: {budget / 1e6:.0f} MB less model {vals['model']}'s "
                f"non-expert tensors (at least {bounds.non_expert_bytes_at_least(model) / 1e6:.0f} "
                f"MB) and {bounds.RUN_MARGIN_BYTES / 1e6:.0f} MB for llama.cpp's buffers and the "
                f"worker is {max(left, 0) // unit} {p.unit} at most")


def usable_cpus() -> int | None:
    """The CPUs this process may run on (its affinity), None where that is not known."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _measured_elsewhere(config: dict) -> bool:
    """The measurements run on other machines (a cluster node or a fleet): this one's CPUs do
    not bound them."""
    return bool((config.get("cluster") or {}).get("node") or (config.get("cluster") or {})
                .get("partition") or config.get("machines"))


def _synthetic_experts(model: dict) -> int | None:
    """Experts per layer of a synthetic model's shape (0: dense); None when not known before the
    file exists (a downloaded or local model)."""
    if model.get("source") != "synthetic":
        return None
    from harness.models.synthetic import SHAPES

    shape = SHAPES.get(model.get("shape"))
    return shape.n_expert if shape else None


def check(config: dict, workdir: Path | None = None) -> list[RunSpec]:
    """Cross-key checks the JSON schema cannot express; returns the expanded runs (their paths
    checked under `workdir`, default the working directory)."""
    names = study_profiles(config)
    for name in names:
        if name not in config.get("profiles", {}):
            raise ConfigError(f"config: profile: {name!r} is not one of the profiles: "
                              f"{', '.join(config.get('profiles', {}))}")
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"config: profile: {config.get('profile')!r} must name each profile once")
    for section in ("profiles", "models"):
        for name in config.get(section) or {}:
            if not NAME_RE.match(str(name)):
                raise ConfigError(f"config: {section}.{name}: {name!r} is not a usable name: it "
                                  "becomes a path under results/ (letters, digits, . _ + -, not "
                                  "starting with . or -)")
    for k in ("node", "partition"):
        v = (config.get("cluster") or {}).get(k)
        if v is not None and not SLURM_NAME_RE.match(str(v)):
            raise ConfigError(f"config: cluster.{k}: {v!r} is not a SLURM {k} name (letters, "
                              "digits, . _ -)")
    local = (config.get("cluster") or {}).get("local_dir")
    if local is not None and (not str(local).startswith("/") or "\n" in str(local)):
        raise ConfigError(f"config: cluster.local_dir: {local!r} must be an absolute path")
    for name, prof in config["profiles"].items():
        for k in profile_keys.SIZES:
            if prof.get(k) is not None:
                parse_size(prof[k], f"profiles.{name}.{k}")
    for name, m in config.get("models", {}).items():
        src = m.get("source")
        # every model names its quant: the findings pair Q4_K_M with Q2_K by it
        need = {"synthetic": ("shape", "quant"),
                "huggingface": ("repo", "file", "revision", "sha256", "quant"),
                "path": ("path", "quant")}
        if src not in need:
            raise ConfigError(f"config: models.{name}.source: {src!r} is not one of "
                              "synthetic, huggingface, path")
        for k in need[src]:
            if not m.get(k):
                raise ConfigError(f"config: models.{name}.{k}: missing (a {src} model needs "
                                  f"{', '.join(need[src])})")
        if src == "synthetic":
            from harness.models.synthetic import SHAPES

            if m["shape"] not in SHAPES:
                raise ConfigError(f"config: models.{name}.shape: {m['shape']!r} is not one of "
                                  f"{', '.join(SHAPES)}")
    _check_ram_budgets(config)
    ceil = config.get("ceilings", {})
    for k in ("dense_model", "moe_model"):
        if ceil.get(k) and ceil[k] not in config.get("models", {}):
            raise ConfigError(f"config: ceilings.{k}: {ceil[k]!r} is not one of the models")
    for m in ceil.get("baseline_models") or []:
        if m not in config.get("models", {}):
            raise ConfigError(f"config: ceilings.baseline_models: {m!r} is not one of the models: "
                              f"{', '.join(config.get('models', {}))}")
    return expand(config, workdir)


def _check_ram_budgets(config: dict) -> None:
    for name in study_profiles(config):
        _check_ram_budget(config, name)


def _check_ram_budget(config: dict, name: str) -> None:
    """A budget below a model's non-expert tensors (at least, harness.bounds) can never hold
    the always-needed set."""
    rb = config["profiles"][name].get("ram_budget")
    if rb is None:
        return
    budget = parse_size(rb, f"profiles.{name}.ram_budget")
    for mname, m in config.get("models", {}).items():
        need = bounds.non_expert_bytes_at_least(m)
        if budget < need:
            raise ConfigError(f"config: profiles.{name}.ram_budget: {budget} bytes is smaller than model "
                              f"{mname}'s non-expert tensors (at least {need} bytes)")


SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


def validate_config(config: dict) -> list[RunSpec]:
    """What the Snakefile does at start, as a function: the JSON schema (with its defaults), then
    the cross-key checks. Raises ConfigError naming the key."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(config, str(SCHEMA))
    except WorkflowError as exc:
        raise ConfigError(f"config: {exc}") from None
    return check(config)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key written twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"config: {key_node.start_mark.name}, line "
                                  f"{key_node.start_mark.line + 1}: key {key!r} is written twice in "
                                  "one mapping (only the last would count)")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def check_config_file(path) -> None:
    """Refuse what a YAML library accepts silently: the same key twice in one mapping."""
    with open(path) as fh:
        yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
