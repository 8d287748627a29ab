"""Every key of a machine profile (`profiles.<name>` in the config), declared once: its kind, unit,
bounds, what it means, and, for a limit, the field of box.limits.Limits it sets, whether it
needs the model's block device, its `python -m harness` flag and its runs.csv column.

Derived from this registry: the schema's profile entry (workflow/schemas/profiles.schema.yaml,
generated), config/README.md's profile table (generated), the config's size checks and
`profiles.profile_limits`, the fields of `Limits` and its disk limits, the command line's limit
flags, the record's `limits_requested`, the runs.csv columns of the limits in force and the
RESULTS.md machine table. A throttle of the disk names its cgroup v1 and v2 files here and
box.limits writes it with the others; a limit of another new kind needs its writes there. Like harness.parameters, it imports nothing of the
package: everything may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

SIZE, INTEGER, NUMBER, BOOLEAN, STRING, RUN_PARAMETERS = (
    "size", "integer", "number", "boolean", "string", "run parameters")


@dataclass(frozen=True)
class ProfileKey:
    name: str
    kind: str  # SIZE (bytes, or a string like "1.7GiB"), INTEGER, NUMBER, BOOLEAN, STRING, ...
    doc: str
    unit: str = ""
    default: object = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    required: bool = False
    # a limit: the box.limits.Limits field it sets, which is also its key in the record's
    # limits_requested and limits_in_force ("": not a limit)
    limit: str = ""
    disk: bool = False  # a limit of the models' block device (a model on tmpfs cannot have it)
    cli: bool = False  # `python -m harness --<name>` sets it for a run by hand
    column: str = ""  # its runs.csv column: the limit in force ("": none)
    # a throttle of the models' disk: its cgroup v1 blkio file and its cgroup v2 io.max key
    # (box.limits writes every throttle declared so, in the run's cgroup, at the first decode)
    v1_file: str = ""
    v2_key: str = ""
    # how the profile's results are read, not what its measurements are held to: editing it
    # measures nothing again (not in a measurement's params)
    reading: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KEYS: tuple[ProfileKey, ...] = (
    ProfileKey("description", STRING, "what the profile stands for", reading=True),
    ProfileKey("threads", INTEGER, "CPU threads for every measurement", minimum=1, required=True),
    ProfileKey("ram_budget", SIZE, "RAM budget (bytes, or like \"1.7GiB\"); page cache, mlocked "
               "and anonymous memory count", unit="bytes", limit="ram_bytes", cli=True,
               column="ram_budget_bytes"),
    ProfileKey("read_bps", SIZE, "disk read throughput cap (bytes/s, or like \"150MB\") on the "
               "models' disk", unit="bytes/s", limit="read_bps", disk=True, cli=True,
               column="read_bps_limit", v1_file="blkio.throttle.read_bps_device", v2_key="rbps"),
    ProfileKey("write_bps", SIZE, "disk write throughput cap (bytes/s) on the models' disk; on "
               "cgroup v1 it cannot see buffered writeback (the flusher threads write from the "
               "root cgroup), which every record shows", unit="bytes/s", limit="write_bps",
               disk=True, cli=True, column="write_bps_limit",
               v1_file="blkio.throttle.write_bps_device", v2_key="wbps"),
    ProfileKey("read_iops", INTEGER, "disk read operations per second cap on the models' disk "
               "(null = none): a device that serves fewer slab reads a second than this one",
               unit="IO/s", minimum=1, limit="read_iops", disk=True, cli=True,
               column="read_iops_limit", v1_file="blkio.throttle.read_iops_device",
               v2_key="riops"),
    ProfileKey("read_ahead_kb", INTEGER, "the models' block device read_ahead_kb during every "
               "measurement, restored afterwards (null = leave the device as it is; recorded "
               "either way)", unit="KiB", minimum=0, limit="read_ahead_kb", disk=True, cli=True,
               column="read_ahead_kb"),
    ProfileKey("cpu_quota", NUMBER, "CPU time per measurement in CPUs (cgroup cfs quota / "
               "period, shared by all threads); null = none unless compute_target_tok_s "
               "calibrates one", unit="CPUs", minimum=0, exclusive_minimum=True,
               limit="cpu_quota", cli=True, column="cpu_quota"),
    ProfileKey("compute_target_tok_s", NUMBER, "calibrate the CPU quota so that the dense compute "
               "ceiling (llama-bench decode of ceilings.dense_model) comes out at this rate (the "
               "study's box, 2.0); ignored when cpu_quota is set", unit="tok/s", minimum=0,
               exclusive_minimum=True),
    ProfileKey("io_share_target", NUMBER, "calibrate the CPU quota so that I/O wait is this share "
               "of the calibration configuration's steady token (the study's 0.58 for "
               "pread+madvise+mlock on ceilings.moe_model), by the per-token attribution; ignored "
               "when cpu_quota or compute_target_tok_s is set", minimum=0, exclusive_minimum=True,
               maximum=1, exclusive_maximum=True),
    ProfileKey("run_defaults", RUN_PARAMETERS, "run parameters every run of this profile takes "
               "unless its experiment sets them (between the study's defaults and the experiment)",
               reading=True),
    ProfileKey("min_effect", NUMBER, "the smallest difference in tok/s a directional verdict "
               "claims in this regime (null = the 10% minimum effect, harness.analysis.stats."
               "MIN_EFFECT); raise it where the regime's between-run noise cannot resolve that "
               "with the repeats the main job can afford (README \"Design\")", minimum=0, exclusive_minimum=True, maximum=1,
               reading=True),
    ProfileKey("allow_unenforced", BOOLEAN, "run even where a limit cannot be applied (the run "
               "record says so)", default=False),
)
BY_NAME = {k.name: k for k in KEYS}
LIMITS = tuple(k for k in KEYS if k.limit)
DISK_LIMITS = tuple(k.limit for k in LIMITS if k.disk)
THROTTLES = tuple(k for k in LIMITS if k.v1_file or k.v2_key)  # the disk's, written alike
SIZES = tuple(k.name for k in KEYS if k.kind == SIZE)
READING_KEYS = tuple(k.name for k in KEYS if k.reading)

_JSON = {SIZE: ["string", "integer", "null"], INTEGER: ["integer", "null"],
         NUMBER: ["number", "null"], BOOLEAN: "boolean", STRING: "string"}


def _entry(k: ProfileKey) -> dict:
    if k.kind == RUN_PARAMETERS:
        return {"$ref": "parameters.schema.yaml#/$defs/profile_defaults"}
    kind = _JSON[k.kind]
    # a copy each: a shared list would be written as a YAML anchor
    out: dict = {"type": "integer" if k.required and k.kind == INTEGER else
                 (list(kind) if isinstance(kind, list) else kind)}
    if k.minimum is not None:
        out["exclusiveMinimum" if k.exclusive_minimum else "minimum"] = k.minimum
    if k.maximum is not None:
        out["exclusiveMaximum" if k.exclusive_maximum else "maximum"] = k.maximum
    if not k.required and k.kind != STRING:
        out["default"] = k.default
    out["description"] = k.doc
    return out


def schema() -> dict:
    """workflow/schemas/profiles.schema.yaml: one profile's entry, which config.schema.yaml's
    `profiles` refers to."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"profile": {
        "type": "object", "additionalProperties": False,
        "required": [k.name for k in KEYS if k.required],
        "properties": {k.name: _entry(k) for k in KEYS}}}}


def markdown_table() -> str:
    """config/README.md's table of profile keys (generated: `python -m harness.docs`)."""
    rows = ["| key | kind | default | a limit | meaning |", "|---|---|---|---|---|"]
    for k in KEYS:
        kind = k.kind + (f" ({k.unit})" if k.unit else "")
        default = "required" if k.required else ("-" if k.default is None else f"`{k.default}`")
        limit = ""
        if k.limit:
            limit = "yes" + (", of the disk" if k.disk else "") + (f"; runs.csv `{k.column}`"
                                                                   if k.column else "")
        elif k.reading:
            limit = "no: how results are read"
        rows.append(f"| `{k.name}` | {kind} | {default} | {limit} | {k.doc} |")
    return "\n".join(rows) + "\n"
