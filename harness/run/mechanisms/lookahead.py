"""A wrapper: predicts the next layer's experts from this layer's hidden state and reads them
ahead through a base mechanism, recording each prediction against the real routing."""

from __future__ import annotations

import ctypes
import os
import time

from harness import catalog
from harness.run.mechanisms.base import Mechanism, Residency, make, register
from harness.run.mechanisms.routing import predict_experts, read_ffn_norms, read_routers
from harness.libc import (MADV_WILLNEED, POSIX_FADV_WILLNEED, madvise)
from harness.libc import lib as _libc


READ_AHEAD_CALLS = ("madvise", "fadvise", "readahead")


@register
class Lookahead(Mechanism):
    """Predict the next layer's experts and start reading them before they are routed.

    When layer L's router input is known (the output of `ffn_norm-L`, or the residual stream
    `l_out-L`), apply layer L+d's router weights (`ffn_gate_inp`, read from the file) to it for
    d = 1..lookahead_layers, take the top lookahead_experts, and issue asynchronous read-ahead for
    their slabs (MADV_WILLNEED, POSIX_FADV_WILLNEED or readahead(2): each starts the reads and
    returns). The reads then run while layer L's experts and L+1's attention compute. When L+1's
    real routing arrives, the base mechanism makes its routed slabs resident as it always does,
    completing what the prediction missed. Every layer's prediction is recorded against the real
    routing: hits, precision, recall, bytes read ahead that were never routed, and how many of the
    predicted slabs' bytes were resident when their layer ran."""

    name = "lookahead"
    row_fields = ("token", "layer", "source_layer", "predicted", "routed", "n_predicted", "n_routed",
                  "hits", "precision", "recall", "wasted_bytes", "predicted_resident_bytes",
                  "predicted_bytes")

    def __init__(self, model, *, lookahead_base: str, lookahead_experts: int,
                 lookahead_layers: int, lookahead_call: str, lookahead_source: str, **options):
        super().__init__(model, **options)
        if lookahead_base not in catalog.base_mechanisms():
            raise ValueError(f"lookahead_base: {lookahead_base!r} is not a base mechanism")
        if lookahead_call not in READ_AHEAD_CALLS:
            raise ValueError(f"lookahead_call: {lookahead_call!r} is not one of {READ_AHEAD_CALLS}")
        if lookahead_source not in ("ffn_norm", "l_out"):
            raise ValueError(f"lookahead_source: {lookahead_source!r} is not ffn_norm or l_out")
        self.base = make(lookahead_base, model)
        self.c = self.base.c  # the base's reads are this mechanism's accounted prefetch
        self.lock = self.base.lock
        self.k = int(lookahead_experts)
        self.depth = int(lookahead_layers)
        self.call = lookahead_call
        self.observes = f"{lookahead_source}-".encode()
        self.source = lookahead_source
        self.routers = read_routers(model)
        self.norms = read_ffn_norms(model)
        self.residency = Residency(model)
        self.token = 0
        self.predicted: dict[int, tuple[int, set[int]]] = {}  # layer -> (source layer, experts)
        self.rows: list[tuple] = []
        self.bytes_read_ahead = 0

    def begin_decode(self, first_token, n_tokens):
        self.token = first_token if n_tokens == 1 else -1  # -1: the prompt batch
        self.predicted.clear()
        self.base.begin_decode(first_token, n_tokens)

    def _advise(self, offset: int, nbytes: int) -> None:
        if self.call == "madvise":
            madvise(self.model.base + offset, nbytes, MADV_WILLNEED)
        elif self.call == "fadvise":
            os.posix_fadvise(self.model.fd, offset, nbytes, POSIX_FADV_WILLNEED)
        elif _libc.readahead(self.model.fd, offset, nbytes) < 0:
            raise OSError(ctypes.get_errno(), "readahead(2) failed")

    def on_hidden(self, layer, rows):
        t0 = time.perf_counter()
        for target in range(layer + 1, layer + 1 + self.depth):
            w = self.routers.get(target)
            if w is None:
                continue
            experts = predict_experts(rows, self.source, self.norms.get(layer),
                                      self.norms.get(target), w, self.k)
            # a nearer layer refines a prediction made further back: read ahead what it adds
            _, before = self.predicted.get(target, (layer, set()))
            self.predicted[target] = (layer, before | experts)
            for e in sorted(experts - before):
                for sl in self.layout.slabs(target, e):
                    self._advise(sl.offset, sl.nbytes)
                    self.bytes_read_ahead += sl.nbytes
        self.c.other_s += time.perf_counter() - t0

    def on_route(self, layer, experts):
        pred = self.predicted.get(layer)
        if pred is not None:
            source, predicted = pred
            routed = set(experts)
            hits = len(predicted & routed)
            slab = self.layout.slab_bytes(layer)  # one expert's gate+up+down bytes
            resident = sum(sl.nbytes - self.residency.missing_bytes(sl.offset, sl.nbytes)
                           for e in sorted(predicted) for sl in self.layout.slabs(layer, e))
            self.rows.append((self.token, layer, source, " ".join(map(str, sorted(predicted))),
                              " ".join(map(str, sorted(routed))), len(predicted), len(routed), hits,
                              hits / len(predicted) if predicted else float("nan"),
                              hits / len(routed) if routed else float("nan"),
                              len(predicted - routed) * slab, resident, len(predicted) * slab))
        self.base.on_route(layer, experts)

    def take_rows(self):
        rows, self.rows = self.rows, []
        return rows

    def drain(self):
        self.base.drain()

    def close(self):
        self.base.close()
