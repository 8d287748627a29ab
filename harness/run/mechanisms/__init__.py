"""Prefetch mechanisms: each acts on the routing decision of one layer, before its expert matmuls.

All share one interface (base.Mechanism): `on_route(layer, experts)` is called from the eval
callback with the unique expert ids the layer just routed to (the matmuls run right after it
returns), and counters say how long each kind of call took and how many bytes it prefetched.
They never change the math: every mechanism leaves the weights' values exactly as they are in
the file. One module a family: pagecache (the kernel's cache is the only cache), odirect (memory
of the run's own, read around the page cache), lookahead (a wrapper that reads ahead on a
prediction); routing holds the router maths they predict with. Importing this package registers
every mechanism of harness.catalog.
"""

from harness.run.mechanisms import lookahead, odirect, pagecache  # noqa: F401 - they register
from harness.run.mechanisms.base import (REGISTRY, Counters, MappedModel, Mechanism, Residency,
                                         make, register)
from harness.run.mechanisms.pagecache import NoPrefetch
from harness.run.mechanisms.routing import predict_experts

__all__ = ["REGISTRY", "Counters", "MappedModel", "Mechanism", "NoPrefetch", "Residency", "make",
           "predict_experts", "register"]
