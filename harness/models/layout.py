"""The byte layout of a GGUF file, read with gguf's reader (never by loading the model).

This is the one source of byte accounting for the harness and RESULTS.md: every tensor's name,
type, shape, file offset and size; for each merged expert tensor (`blk.N.ffn_{gate,up,down}_exps`,
expert outermost) the per-expert slab size, so expert e of that tensor is the contiguous range
[base_offset + e * bytes_per_expert, + bytes_per_expert).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import gguf

EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")

# the project's own GGUF metadata keys (harness.models.synthetic writes them, every reader reads these)
SYNTHETIC_KEY = "moe_offload_bench.synthetic"
SEED_KEY = "moe_offload_bench.seed"
SHAPE_KEY = "moe_offload_bench.shape"
SCALES_KEY = "moe_offload_bench.weight_scales"
EXPERT_WEIGHTS_KEY = "moe_offload_bench.expert_weights"


def is_expert_tensor(name: str) -> bool:
    """A merged expert tensor (blk.N.ffn_{gate,up,down}_exps.weight): the slabs the mechanisms read."""
    return EXPERT_RE.match(name) is not None
EXPERT_KINDS = ("gate", "up", "down")


class LayoutError(ValueError):
    pass


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return f.contents() if f is not None else default


def read_layout(path: os.PathLike) -> dict:
    path = Path(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError/struct errors/etc. for non-GGUF input
        raise LayoutError(f"{path}: corrupted or truncated GGUF file ({exc})") from exc
    arch = _field(reader, "general.architecture")
    n_expert = int(_field(reader, f"{arch}.expert_count", 0) or 0)
    n_used = int(_field(reader, f"{arch}.expert_used_count", 0) or 0)
    n_layer = int(_field(reader, f"{arch}.block_count", 0) or 0)
    file_size = path.stat().st_size
    tensors, experts = [], []
    non_expert_bytes = 0
    for t in reader.tensors:
        offset, nbytes = int(t.data_offset), int(t.n_bytes)
        if offset + nbytes > file_size:
            raise LayoutError(f"{path}: tensor {t.name} ends at byte {offset + nbytes}, past the end "
                              f"of the file ({file_size} bytes): the file is truncated")
        rec = {"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
               "offset": offset, "bytes": nbytes}
        m = EXPERT_RE.match(t.name)
        if m:
            ne_outer = int(t.shape[-1])
            if ne_outer != n_expert or nbytes % n_expert:
                raise LayoutError(f"{path}: {t.name} has {ne_outer} experts outermost, header says "
                                  f"{n_expert}")
            per = nbytes // n_expert
            rec.update(expert=True, layer=int(m.group(1)), kind=m.group(2), bytes_per_expert=per)
            experts.append({"name": t.name, "layer": int(m.group(1)), "kind": m.group(2),
                            "base_offset": offset, "bytes_per_expert": per, "n_expert": n_expert,
                            "formula": f"{offset} + expert_id * {per}"})
        else:
            rec["expert"] = False
            non_expert_bytes += nbytes
        tensors.append(rec)
    experts.sort(key=lambda x: (x["layer"], EXPERT_KINDS.index(x["kind"])))
    slab_per_layer = {}
    for x in experts:
        slab_per_layer[x["layer"]] = slab_per_layer.get(x["layer"], 0) + x["bytes_per_expert"]
    synthetic = bool(_field(reader, SYNTHETIC_KEY, False))
    seed = _field(reader, SEED_KEY)
    return {
        "model": str(path),
        "file_size": file_size,
        "architecture": arch,
        "name": _field(reader, "general.name"),
        "file_type": int(_field(reader, "general.file_type", -1)),
        "synthetic": synthetic,
        "seed": int(seed) if seed is not None else None,
        "n_layer": n_layer,
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "n_tensors": len(tensors),
        "tensors": tensors,
        "expert_tensors": experts,
        "non_expert_bytes": non_expert_bytes,
        "non_expert_count": sum(1 for t in tensors if not t["expert"]),
        "expert_bytes": sum(t["bytes"] for t in tensors if t["expert"]),
        # every token routes n_used experts per layer, each needing its gate, up and down slab
        "bytes_per_token": n_used * sum(slab_per_layer.values()),
        "slab_bytes_per_layer": {str(k): v for k, v in sorted(slab_per_layer.items())},
    }


@dataclass(frozen=True)
class Slab:
    offset: int
    nbytes: int


class Layout:
    """Fast lookups over a layout dict for the harness's hot path."""

    def __init__(self, data: dict):
        self.data = data
        self.n_layer = data["n_layer"]
        self.n_expert = data["n_expert"]
        self.n_expert_used = data["n_expert_used"]
        # per layer: [(base_offset, bytes_per_expert, name)] for gate, up, down
        self.by_layer: dict[int, list[tuple[int, int, str]]] = {}
        for x in data["expert_tensors"]:
            self.by_layer.setdefault(x["layer"], []).append(
                (x["base_offset"], x["bytes_per_expert"], x["name"]))

    @classmethod
    def load(cls, path: os.PathLike) -> Layout:
        return cls(json.loads(Path(path).read_text()))

    def slabs(self, layer: int, expert: int) -> list[Slab]:
        """The gate/up/down byte ranges of one expert; a layer or expert id the model does not have
        is an error (a misread routing tensor must never prefetch some other offset)."""
        rows = self.by_layer.get(layer)
        if rows is None:
            raise IndexError(f"layer {layer}: the model has MoE layers {min(self.by_layer, default=0)}"
                             f"..{max(self.by_layer, default=-1)}")
        if not 0 <= expert < self.n_expert:
            raise IndexError(f"layer {layer}: expert id {expert} is outside 0..{self.n_expert - 1}")
        return [Slab(base + expert * per, per) for base, per, _ in rows]

    def slab_bytes(self, layer: int) -> int:
        return sum(per for _, per, _ in self.by_layer.get(layer, ()))

    @property
    def non_expert_tensors(self) -> list[dict]:
        return [t for t in self.data["tensors"] if not t["expert"]]
