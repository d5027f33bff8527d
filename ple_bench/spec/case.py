"""A case: plain data, the value of every axis.  Everything the runner needs is
derived from it, and the same axes give the same ``case_id`` on every run.

``case_id`` lists the axes that differ from their defaults (so adding a new axis
with a default later keeps old ids stable), followed by a short hash of them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..units import DTYPE_BYTES

#: lookup: one lookup; step: a synthetic decode step; serve: a model's whole decode step at the
#: batch a table placement leaves HBM for (ple_bench.run.serve)
KINDS = ("lookup", "step", "serve")
GRAPH_MODES = ("eager", "breakable", "full")
#: where a case's ids live when the lookup (or step) starts: produced on the GPU,
#: or known on the host (as a server's scheduler knows them), in pinned memory
IDS_ON = ("device", "host")
#: how a pinned table's host memory is allocated (ple_bench.backends.cuda.host_alloc)
HOST_ALLOC_MODES = ("torch", "exact", "exact_huge")
#: the decode step's main-stream compute (ple_bench.compute): the calibrated matmul chain,
#: or real decoder layers at a named shape
COMPUTE_KINDS = ("matmul", "decoder")
#: the axes of the decoder compute only (reset to their defaults on other cases)
DECODER_AXES = ("decoder_shape", "decoder_layers", "context_len")
#: the axes of the served step only (reset to their defaults on other cases)
SERVE_AXES = ("model", "kv_dtype", "gpu_memory_utilization", "batch_fraction")
#: axes a served step sets itself (the batch from the capacity rule; the path from the placement)
SERVE_DERIVED_AXES = ("num_tokens", "graph", "prefetch", "ids_on", "compute", "compute_us", "hidden",
                      "decoder_shape", "decoder_layers")


@dataclass(frozen=True)
class Case:
    # What is measured: one lookup ("lookup") or a synthetic decode step ("step").
    kind: str = "lookup"
    impl: str = "device"  # backend name or "package.module:Class"
    kernel: str = ""  # lookup kernel; "" = the backend's default
    vocab_size: int = 1 << 20
    dim: int = 128
    dtype: str = "bf16"  # fp32 | fp16 | bf16 | fp8
    num_heads: int = 1
    num_tokens: int = 256  # per DP rank
    tp: int = 1
    etp: int = 1
    dp: int = 1
    prefetch: bool = False
    graph: str = "eager"  # eager | breakable | full
    ids: str = "uniform"  # uniform | zipf:<a> | ngram[:<orders>]
    seed: int = 0
    # decode-step axes (kind == "step")
    compute_us: float = 0.0  # main-stream compute between start_prefetch and finalize
    hidden: int = 4096
    stream_priority: int = 0  # priority of the prefetch side stream (lower = higher priority)
    grid_frac: float = 1.0  # share of the lookup's grid / SMs the lookup may take
    sm_limit: int = 0  # SMs the prefetch side stream may use (a green context); 0 = no limit
    h2d_background: bool = False  # a host→device copy kept busy beside the step's measurements (the link shared)
    # lookup-path axes
    cache_rows: int = 0  # hot-row cache in GPU memory (0 = none)
    ids_on: str = "device"  # device | host: where the ids are when the lookup / step starts
    gather_threads: int = 0  # host-gather threads of the CPU-gather path (0 = the cores torch sees, <= 16)
    host_alloc: str = "torch"  # pinned tables: torch (caching allocator) | exact | exact_huge
    # the step's compute (kind == "step"): matmul (the chain, compute_us) | decoder (the layers below)
    compute: str = "matmul"
    decoder_shape: str = "qwen3-8b"  # a name of ple_bench.compute.DECODER_SHAPES
    decoder_layers: int = 2  # layers between the lookup's issue and its use
    context_len: int = 4096  # KV-cache positions per sequence
    # the served step (kind == "serve"): a model preset (ple_bench.serving.models.MODELS), its KV dtype,
    # the share of HBM a server budgets, and the share of the placement's largest batch that is run
    model: str = "qwen3-8b"
    kv_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.90
    batch_fraction: float = 1.0
    extra: tuple[tuple[str, Any], ...] = field(default=())  # free-form axes of plug-in backends

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @property
    def row_bytes(self) -> int:
        return self.dim * DTYPE_BYTES[self.dtype]

    @property
    def table_bytes(self) -> int:
        return self.vocab_size * self.row_bytes

    def axes(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d

    def changed_axes(self) -> dict[str, Any]:
        defaults = Case()
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name):
                out[f.name] = dict(value) if f.name == "extra" else value
        return out

    @property
    def case_id(self) -> str:
        changed = self.changed_axes()
        blob = json.dumps(changed, sort_keys=True, default=str)
        digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
        parts = [self.kind, _short(self.impl)]
        if self.kernel:
            parts.append(self.kernel)
        parts += [f"v{self.vocab_size}", f"d{self.dim}", self.dtype, f"h{self.num_heads}"]
        if self.kind == "serve":  # the batch is the capacity rule's, not an axis
            parts.append(f"{self.model}-ctx{self.context_len}-kv{self.kv_dtype}-b{self.batch_fraction:g}")
            if self.gpu_memory_utilization != 0.90:
                parts.append(f"gmu{self.gpu_memory_utilization:g}")
        else:
            parts.append(f"t{self.num_tokens}")
        if self.world_size > 1 or self.etp > 1:
            parts.append(f"tp{self.tp}etp{self.etp}dp{self.dp}")
        if self.prefetch:
            parts.append("pf")
        if self.graph != "eager":
            parts.append(self.graph)
        if self.ids != "uniform":
            parts.append(self.ids.replace(":", "").replace(",", ""))
        if self.kind == "step" and self.compute == "decoder":
            parts.append(f"dec-{self.decoder_shape}-L{self.decoder_layers}-ctx{self.context_len}")
        elif self.kind == "step":
            parts.append(f"c{self.compute_us:g}us")
        if self.stream_priority:
            parts.append(f"prio{self.stream_priority}")
        if self.grid_frac != 1.0:
            parts.append(f"grid{self.grid_frac:g}")
        if self.sm_limit:
            parts.append(f"sm{self.sm_limit}")
        if self.h2d_background:
            parts.append("h2dbg")
        if self.cache_rows:
            parts.append(f"cache{self.cache_rows}")
        if self.ids_on != "device":
            parts.append(f"ids{self.ids_on}")
        if self.gather_threads:
            parts.append(f"gt{self.gather_threads}")
        if self.host_alloc != "torch":
            parts.append(self.host_alloc)
        for key, value in self.extra:  # plug-in settings (e.g. chunks4, pin_threads)
            parts.append(key if value is True else f"{key}{value}")
        return ".".join(parts) + "-" + digest

    @property
    def table_key(self) -> tuple:
        """What makes two cases' tables differ (the executor builds one backend per key and
        keeps it while the next case has the same key): the table's bytes (rows, dim, dtype,
        its ETP shard), where and how it is allocated (``impl``, ``host_alloc``) and the
        backend's construction-time settings (heads, cache, side stream, gather threads, plug-in
        options).  Token count, kernel, ids, prefetch, graph mode, kind and compute are not
        part of it: cases differing only in those share one filled table."""
        return (self.tp, self.etp, self.dp, self.vocab_size, self.dim, self.dtype, self.num_heads,
                self.impl, self.host_alloc, self.cache_rows, self.stream_priority, self.sm_limit,
                self.gather_threads, self.extra)

    @property
    def has_compute(self) -> bool:
        return has_compute(self.axes())

    @classmethod
    def from_axes(cls, axes: dict[str, Any]) -> "Case":
        axes = dict(axes)
        extra = axes.pop("extra", None) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(axes) - known
        if unknown:
            raise ValueError(f"unknown axes {sorted(unknown)}")
        return cls(**axes, extra=tuple(sorted(dict(extra).items())))


#: the resident step a pinned step is held against: its path axes at these values
#: (:data:`ple_bench.record.PATH_AXES`; graph mode and prefetch: see resident_baselines)
RESIDENT_PATH = {"impl": "device", "kernel": "", "ids_on": "device", "host_alloc": "torch", "gather_threads": 0,
                 "cache_rows": 0, "grid_frac": 1.0, "stream_priority": 0, "sm_limit": 0, "extra": ()}


def resident_baselines(case: Case) -> list[Case]:
    """The resident steps a pinned step's ``offload_overhead`` needs (none for other cases):
    the device table with ids on the device and the same workload, in the step's own graph
    mode and prefetch (its like-for-like figure), and breakable without prefetch (a breakable
    resident step also times its full graph: the best a server replays; a resident lookup
    needs no side stream)."""
    if case.kind != "step" or case.impl == "device":
        return []
    settings = dict.fromkeys([(case.graph, case.prefetch), ("breakable", case.prefetch), ("breakable", False)])
    return [dataclasses.replace(case, graph=g, prefetch=p, **RESIDENT_PATH) for g, p in settings]


def with_baselines(cases: list[Case]) -> list[Case]:
    """``cases`` and, after them, the resident baselines they lack (de-duplicated, in order)."""
    seen = {c.case_id for c in cases}
    out = list(cases)
    for case in cases:
        for base in resident_baselines(case):
            if base.case_id not in seen:
                seen.add(base.case_id)
                out.append(base)
    return out


def has_compute(axes: Any) -> bool:
    """A step's axes (a case's, or a record's) put compute between the lookup's issue and
    its use: the decoder layers, or a matmul chain of compute_us > 0."""
    if axes.get("compute") == "decoder":
        return True
    try:
        return float(axes.get("compute_us") or 0) > 0
    except (TypeError, ValueError):
        return False


def _short(impl: str) -> str:
    return impl.rsplit(":", 1)[-1] if ":" in impl else impl
