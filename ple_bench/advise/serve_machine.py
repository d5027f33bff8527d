"""The serve step model in machine terms: each term of a decode step divided by the figure that binds it,
the share of that figure the runs' machine achieved, carried to the target GPU.

The fitted step (:class:`ple_bench.advise.serving.StepModel`)::

    step = fixed + bytes × ms_per_byte + batch × per_seq_ms + exposed[placement]

reads, term by term, as

* ``bytes / (η_hbm × HBM)``: weights and KV streamed from HBM; ``η_hbm`` = the fitted rate over the
  runs' machine's figure (its measured ``hbm_read_gbps`` ceiling where the target's achievable rate is
  measured or given, else its datasheet peak, the target's datasheet peak then);
* ``batch × FLOPs per sequence / (φ × FLOP/s)``: each sequence's matmul work (2 × the matmul weights)
  not hidden under the byte stream, over the dense BF16 datasheet peak; ``φ`` may exceed 1, which says
  the matmuls are partly hidden;
* ``exposed[host]``: the host gather's rows over the host link: scaled by the link's rate
  (measured h2d over the target's);
* ``fixed``: the launch part (one graph replay, the small kernels' latency): assumed the same on any GPU.

On the target each term is the fitted one times (the source's figure ÷ the target's).  Every carried
step is floored at physics: its bytes over the target's HBM peak, its FLOPs over its FLOP/s peak.
:class:`Figures` carries each figure with its kind (``measured``, ``datasheet``, ``assumed``, ``given``)
and its source in words; the answer prints them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from .gpus import Gpu, gpu_of_device


@dataclass
class Figures:
    """A machine as the serve step model sees it.  ``hbm_gbps``: datasheet peak; ``hbm_read_gbps``:
    the achievable read rate (measured ceiling, or given); ``bf16_tflops``: dense peak; ``h2d_gbps``:
    host -> device achieved.  None: unknown."""

    name: str = "unknown GPU"
    hbm_gbps: float | None = None
    hbm_read_gbps: float | None = None
    bf16_tflops: float | None = None
    h2d_gbps: float | None = None
    gpu: Gpu | None = None
    sources: dict[str, str] = field(default_factory=dict)  # figure -> "<kind>: <where>"

    KEYS = ("hbm_gbps", "hbm_read_gbps", "bf16_tflops", "h2d_gbps")

    def with_(self, source: str, **values: Any) -> "Figures":
        out = Figures(self.name, *(getattr(self, k) for k in self.KEYS), gpu=self.gpu, sources=dict(self.sources))
        for k, v in values.items():
            if v is not None:
                setattr(out, k, float(v))
                out.sources[k] = source
        return out

    def kind(self, key: str) -> str:
        return self.sources.get(key, "unknown").split(":")[0]

    def lines(self) -> list[str]:
        unit = {"hbm_gbps": "GB/s HBM peak", "hbm_read_gbps": "GB/s HBM read achievable",
                "bf16_tflops": "TFLOP/s dense BF16 peak", "h2d_gbps": "GB/s host -> device"}
        return [f"{k} = {getattr(self, k):,.1f} {unit[k]} ({self.sources.get(k, '')})" if getattr(self, k)
                else f"{k} = unknown" for k in self.KEYS]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k) for k in self.KEYS}, "sources": dict(self.sources),
                "preset": self.gpu.key if self.gpu else None}


def _median(vals: Sequence[Any]) -> float | None:
    vals = [float(v) for v in vals if isinstance(v, (int, float)) and v and v == v]
    return statistics.median(vals) if vals else None


def runs_figures(metas: Sequence[dict[str, Any]]) -> Figures:
    """The runs' machine: measured ceilings (medians over meta.json) and, where the device name
    matches a preset, its datasheet peaks."""
    names = sorted({str((m.get("device") or {}).get("name")) for m in metas if (m.get("device") or {}).get("name")})
    gpu = gpu_of_device(names[0]) if len(names) == 1 else None
    f = Figures(name=names[0] if len(names) == 1 else (" + ".join(names) or "unknown GPU"), gpu=gpu)
    n = len(metas)
    read = _median([(m.get("ceilings") or {}).get("hbm_read_gbps") for m in metas])
    h2d = _median([(m.get("ceilings") or {}).get("h2d_gbps") for m in metas])
    f = f.with_(f"measured: median hbm_read_gbps ceiling of {n} run(s)", hbm_read_gbps=read)
    f = f.with_(f"measured: median h2d_gbps ceiling of {n} run(s)", h2d_gbps=h2d)
    if gpu is not None:
        f = f.with_(f"{gpu.source('hbm_gbps')} (preset {gpu.key})", hbm_gbps=gpu.hbm_gbps)
        f = f.with_(f"{gpu.source('bf16_tflops')} (preset {gpu.key})", bf16_tflops=gpu.bf16_tflops)
    return f


def target_figures(source: Figures, gpu: Gpu | None, *, hbm_read_gbps: float | None = None,
                   h2d_gbps: float | None = None, given_by: dict[str, str] | None = None) -> Figures:
    """The machine to predict for: the runs' own, or ``gpu``'s preset (its datasheet, no achievable
    rate unless it is the runs' card), then figures given by flags (``given_by``: key -> flag)."""
    given_by = given_by or {}
    if gpu is None or (source.gpu is not None and gpu.key == source.gpu.key):
        t = Figures(source.name, source.hbm_gbps, source.hbm_read_gbps, source.bf16_tflops, source.h2d_gbps,
                    gpu=source.gpu, sources=dict(source.sources))
    else:
        t = Figures(gpu.name, gpu=gpu)
        for key in ("hbm_gbps", "bf16_tflops", "h2d_gbps"):
            t = t.with_(f"{gpu.source(key)} (preset {gpu.key})", **{key: getattr(gpu, key)})
    t = t.with_(f"given: {given_by.get('hbm_read_gbps', '--hbm-gbps')}", hbm_read_gbps=hbm_read_gbps)
    t = t.with_(f"given: {given_by.get('h2d_gbps', '--h2d-gbps')}", h2d_gbps=h2d_gbps)
    return t


@dataclass(frozen=True)
class Scales:
    """How much longer each term takes on the target than on the runs' machine, and why."""

    hbm: float = 1.0
    flops: float = 1.0
    link: float = 1.0
    words: tuple[str, ...] = ()

    @property
    def identity(self) -> bool:
        return self.hbm == 1.0 and self.flops == 1.0 and self.link == 1.0


def scales(source: Figures, target: Figures) -> Scales:
    """Each term's factor: HBM by the achievable rates where the target's is measured or given (and
    the source's measured), else by the datasheet peaks; FLOPs by the dense peaks; the host link by
    the achieved host -> device rates.  1 (said so) where a side does not know the figure."""
    words = []
    hbm = 1.0
    if target.hbm_read_gbps and source.hbm_read_gbps and target.kind("hbm_read_gbps") in ("given", "measured") \
            and target.sources.get("hbm_read_gbps") != source.sources.get("hbm_read_gbps"):
        hbm = source.hbm_read_gbps / target.hbm_read_gbps
        words.append(f"HBM: the achievable read rate, {source.hbm_read_gbps:,.0f} GB/s measured -> "
                     f"{target.hbm_read_gbps:,.0f} GB/s {target.kind('hbm_read_gbps')}")
    elif target.hbm_gbps and source.hbm_gbps and target.hbm_gbps != source.hbm_gbps:
        hbm = source.hbm_gbps / target.hbm_gbps
        words.append(f"HBM: the runs' achieved share of the datasheet peak carried, {source.hbm_gbps:,.0f} -> "
                     f"{target.hbm_gbps:,.0f} GB/s")
    elif target.gpu is not None and source.gpu is None:
        words.append("HBM: the runs' GPU is not a known preset: its rate kept (assumed)")
    if target.bf16_tflops and source.bf16_tflops and target.bf16_tflops != source.bf16_tflops:
        flops = source.bf16_tflops / target.bf16_tflops
        words.append(f"FLOP/s: the dense BF16 peaks, {source.bf16_tflops:,.0f} -> {target.bf16_tflops:,.0f} TFLOP/s")
    else:
        flops = 1.0
    if target.h2d_gbps and source.h2d_gbps and abs(target.h2d_gbps / source.h2d_gbps - 1.0) > 0.02:
        link = source.h2d_gbps / target.h2d_gbps
        words.append(f"host link: {source.h2d_gbps:,.1f} -> {target.h2d_gbps:,.1f} GB/s host -> device")
    else:
        link = 1.0
    return Scales(hbm, flops, link, tuple(words))


def matmul_flops_per_seq(model) -> float:
    """One decode token's matmul FLOPs: 2 × every projection's weights and the LM head (the
    embedding is a gather)."""
    return 2.0 * (model.layers * model.layer_params + model.vocab * model.hidden)
