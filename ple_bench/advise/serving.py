"""``advise --model``: tokens/s and TPOT per placement of the table (pinned host memory or HBM) for
a model preset, a context length, a KV dtype, a GPU and an optional TPOT target -- measured where a
serving run measured it, else predicted -- and the one serving verdict
(:func:`ple_bench.serving.slo.answer_for`) over them.

**Capacity** is the capacity rule's (:func:`ple_bench.serving.capacity.capacity`), printed with its
terms, for the asked HBM (``--hbm-bytes``; default the GPU the runs measured), ETP group and
``gpu_memory_utilization``.

**Measured** rows: the ``kind = "serve"`` records of the runs with the asked model, context, KV dtype,
row shape (dim, dtype, heads) and table (within :data:`TABLE_SLACK`), on a GPU of the asked HBM, ETP 1
and the same ``gpu_memory_utilization``: their points as the run measured them.

**Predicted** rows (each marked): points at the serving suite's fractions (¼, ½, ¾, 1) of the
capacity rule's largest batch, each step from the step-time model::

    step(batch) = fixed + (weight_bytes + batch × context × kv_bytes_per_token) / hbm_read_rate
                  (+ the placement's exposed lookup cost)

fitted by bounded least squares (:func:`ple_bench.advise.model.bounded_fit`: the fixed cost and the
per-byte time ≥ 0, the host placement's extra cost free) on, in this order of preference:

1. the runs' measured serve records (of the asked model where there are two or more, else of every
   model: the bytes term carries the model's size); the host placement's extra cost is fitted
   beside them when both placements were measured;
2. decoder-suite step records (``compute_ms`` against ``compute_bytes``: the decoder layers of a
   decode step), with each placement's exposed lookup cost the median ``exposed_ms`` of the runs'
   stable decode steps of its path (``device`` for HBM, the fastest host path for host) where known;
3. the HBM-read ceiling alone (no fixed cost).

A predicted step is never shorter than its bytes at the fastest ``hbm_read_gbps`` ceiling of the
runs (meta.json ``ceilings``).  The model's error is measured on the measured serve records by
holding out one batch at a time, and one context length at a time (its records refitted without
them), and printed with every answer.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..record import as_record
from ..run_meta import as_meta
from ..verdict import stable
from ..serving.capacity import Capacity, batch_at as serve_batch, served_capacity as _served
from ..serving.models import ModelPreset
from ..serving.slo import (
    PLACEMENT_NAMES as PLACE, PLACEMENTS, Placement, Scenario, ServePoint, ServingAnswer, answer_for, placement_of,
)
from ..units import DTYPE_BYTES, format_bytes
from .gpus import Gpu, gpu_of_device, near_card_words
from .model import bounded_fit
from .serve_machine import Figures, Scales, matmul_flops_per_seq, runs_figures, scales, target_figures

GIB = 1 << 30
#: a measured table within this factor of the asked one answers for it (47.7 GiB vs 51.2 GB)
TABLE_SLACK = 1.05
#: the serving suite's batch fractions of a placement's largest batch
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
#: vLLM's setting for each placement (names as vllm/config/engram.py documents them on
#: docs.vllm.ai/en/latest/api/vllm/config/engram/; the page names no release number), and the lookup path
#: (impl) that setting runs: cpu_offload's lookup is a UVA kernel prefetched on a side stream
ENGINE_SETTING = {
    "host": "vLLM: EngramConfig(cpu_offload=True, use_thp=True) -- the table in pinned host memory, "
            "looked up through UVA and prefetched on a side stream; use_thp backs private tables with "
            "transparent huge pages",
    "hbm": "vLLM: EngramConfig(cpu_offload=False) -- the table in GPU memory",
}
#: the impl each engine setting runs, and the impl ple_bench measures for the placement (the best path)
ENGINE_IMPL = {"host": "pinned_uva", "hbm": "device"}
MEASURED_IMPL = {"host": "pinned_host_flag", "hbm": "device"}
#: what the posted host gather would take in a serving engine (it is no engine setting today)
POSTED_GATHER_NEEDS = ("the posted host gather (pinned_host_flag) is no engine setting today: it would take the "
                       "engine to compute the step's row ids on the host when it schedules the step, gather those "
                       "rows on its own host threads into pinned staging right after launching the step's CUDA "
                       "graph, copy them host -> device, and have the graph wait on a device flag before the layer "
                       "that consumes them (ple_bench/backends/pinned_host_flag.py is that path)")
ENGINE_SETTING_SOURCE = ("names from vLLM's API reference, vllm.config.engram.EngramConfig "
                         "(docs.vllm.ai/en/latest, source vllm/config/engram.py: cpu_offload: bool = True, "
                         "use_thp: bool, embedding_across_dp, dp_shared_memory); the page gives no release "
                         "number and use_thp's default is not confirmed there. cpu_offload's lookup is the UVA "
                         "kernel on a side stream (impl pinned_uva here), not the posted host gather")


class ServingAdviseError(ValueError):
    """Inputs that cannot be answered (exit 2)."""


def _s(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def bytes_read(model: ModelPreset, batch: float, context_len: int, kv_dtype: str) -> float:
    """What one decode step reads from HBM: every weight once and every sequence's KV cache."""
    return model.weight_bytes() + batch * context_len * model.kv_bytes_per_token(kv_dtype)


# ---------------------------------------------------------------- the step model

@dataclass
class StepModel:
    """``step(batch) = fixed + bytes / rate + batch × per_seq + exposed[placement]``, floored at
    bytes / ceiling."""

    fixed_ms: float
    ms_per_byte: float  # 1 / the effective HBM read rate
    exposed_ms: dict[str, float]
    floor_gbps: float | None
    source: str  # how it was fitted, in words
    n_fitted: int = 0
    per_seq_ms: float = 0.0  # what each sequence costs beyond its KV bytes (its share of the matmuls' compute)
    #: the physics floor's compute part: FLOPs per sequence over this many TFLOP/s (0: none)
    floor_tflops: float = 0.0
    flops_per_seq: float = 0.0
    #: how the terms were carried to another machine, in words (empty: the runs' own)
    carried_by: tuple[str, ...] = ()
    scales: Scales = Scales()  # the factors applied to the runs' own terms

    @property
    def rate_gbps(self) -> float | None:
        return None if self.ms_per_byte <= 0 else 1.0 / (self.ms_per_byte * 1e6)

    def step_ms(self, nbytes: float, placement: str, batch: float = 0.0) -> float:
        step = (self.fixed_ms + nbytes * self.ms_per_byte + batch * self.per_seq_ms
                + self.exposed_ms.get(placement, 0.0))
        if self.floor_gbps:
            step = max(step, nbytes / (self.floor_gbps * 1e6))
        if self.floor_tflops and self.flops_per_seq:
            step = max(step, batch * self.flops_per_seq / (self.floor_tflops * 1e9))
        return step

    def carried(self, sc: Scales, target: Figures, flops_per_seq: float) -> "StepModel":
        """This model on ``target``: each term times its scale (the HBM bytes, the per-sequence
        compute, the host link's exposed lookup; the fixed launch part kept), floored at the target's
        bytes over its HBM peak and FLOPs over its dense peak."""
        floor = target.hbm_gbps or target.hbm_read_gbps
        return replace(self, ms_per_byte=self.ms_per_byte * sc.hbm, per_seq_ms=self.per_seq_ms * sc.flops,
                       exposed_ms={k: v * sc.link for k, v in self.exposed_ms.items()}, floor_gbps=floor,
                       floor_tflops=target.bf16_tflops or 0.0, flops_per_seq=flops_per_seq,
                       carried_by=sc.words, scales=sc, source=self.source + f"; carried to the {target.name}")

    def words(self) -> str:
        rate = f"{self.rate_gbps:,.0f} GB/s" if self.rate_gbps else "∞"
        extra = ", ".join(f"{k} {v:+.4f} ms" for k, v in self.exposed_ms.items() if v)
        floor = ((f"; never below the bytes at the target's HBM peak ({self.floor_gbps:,.0f} GB/s)" if self.carried_by
                  else f"; never below the bytes at the hbm_read ceiling ({self.floor_gbps:,.0f} GB/s)")
                 if self.floor_gbps else "; no hbm_read ceiling in the runs: no floor")
        floor += (f", nor below its matmul FLOPs at {self.floor_tflops:,.0f} TFLOP/s"
                  if self.floor_tflops and self.flops_per_seq else "")
        return (f"step(batch) = {self.fixed_ms:.4f} ms + (weights + batch × context × KV bytes per token) / {rate}"
                + (f" + batch × {self.per_seq_ms * 1e3:.2f} us" if self.per_seq_ms else "")
                + (f" + exposed lookup ({extra})" if extra else "") + f" -- {self.source}{floor}")

    def to_json(self) -> dict[str, Any]:
        return {"fixed_ms": self.fixed_ms, "hbm_read_rate_gbps": self.rate_gbps, "per_seq_ms": self.per_seq_ms,
                "exposed_ms": self.exposed_ms, "floor_gbps": self.floor_gbps, "floor_tflops": self.floor_tflops or None,
                "source": self.source, "n_fitted": self.n_fitted, "carried_by": list(self.carried_by)}


@dataclass(frozen=True)
class Sample:
    """A measured serve step as the model sees it."""

    placement: str
    nbytes: float
    step_ms: float
    context_len: int
    serve_batch: int
    case_id: str
    model: str


def serve_samples(records: Sequence[dict[str, Any]], models: dict[str, ModelPreset]) -> list[Sample]:
    """The measured (GPU, ok, KV measured) serve records of known models as model samples."""
    out = []
    for r in records:
        if r.get("kind") != "serve" or r.get("status") != "ok" or _s(r.get("mode")) == "functional":
            continue
        if _s(r.get("kv_source")) == "predicted":
            continue
        m = models.get(_s(r.get("model")))
        rec = as_record(r)
        batch, step, ctx = rec.serve_batch, rec.step_ms, rec.context_len
        if m is None or not batch or not step or not ctx:
            continue
        kv = _s(r.get("kv_dtype")) or "bf16"
        out.append(Sample(_s(r.get("placement")), bytes_read(m, batch, int(ctx), kv), step, int(ctx), int(batch),
                          _s(r.get("case_id")), m.name))
    return out


def fit_samples(samples: Sequence[Sample], floor_gbps: float | None,
                exposed: dict[str, float] | None = None) -> StepModel | None:
    """The step model fitted on serve samples; None with fewer than two distinct byte counts."""
    if len({s.nbytes for s in samples}) < 2:
        return None
    both = {s.placement for s in samples} >= {"host", "hbm"}
    # a per-sequence term where the samples tell it from the bytes (batch and context both varied)
    per_seq = len({(s.nbytes, s.serve_batch) for s in samples}) >= 3 and len({s.context_len for s in samples}) > 1
    X = [[1.0, s.nbytes] + ([float(s.serve_batch)] if per_seq else [])
         + ([1.0 if s.placement == "host" else 0.0] if both else []) for s in samples]
    host_col = 3 if per_seq else 2
    coef = bounded_fit(X, [s.step_ms for s in samples], free=(host_col,) if both else ())
    if both:
        ex = {"hbm": 0.0, "host": coef[host_col]}
    else:  # the measured placement's lookup is in the fit: the other's is its difference from it
        only = samples[0].placement
        base = (exposed or {}).get(only, 0.0)
        ex = {k: v - base for k, v in (exposed or {}).items() if k != only}
        ex[only] = 0.0
    return StepModel(coef[0], coef[1], ex, floor_gbps,
                     f"fitted on {len(samples)} measured serve steps" + (" (host's extra cost fitted beside)"
                                                                         if both else ""), len(samples),
                     coef[2] if per_seq else 0.0)


def _decoder_model(records: Sequence[dict[str, Any]], floor_gbps: float | None,
                   exposed: dict[str, float]) -> StepModel | None:
    recs = [as_record(r) for r in records]
    pts = [(r.compute_bytes, r.compute_ms) for r in recs
           if r.kind == "step" and r.status == "ok" and r.mode != "functional" and r.compute_bytes and r.compute_ms]
    if len({b for b, _ in pts}) < 2:
        return None
    coef = bounded_fit([[1.0, b] for b, _ in pts], [t for _, t in pts])
    return StepModel(coef[0], coef[1], exposed, floor_gbps,
                     f"fitted on {len(pts)} decoder-layer computes of decode steps (compute_ms vs compute_bytes)",
                     len(pts))


def exposed_lookup_ms(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each placement's exposed lookup cost where the runs measured it: the median ``exposed_ms`` of
    stable decode steps of the resident table (``device``, ids on the device) and of the fastest
    host path (the lowest median over pinned impls)."""
    by_impl: dict[str, list[float]] = {}
    for r in records:
        e = as_record(r).exposed_ms
        if r.get("kind") != "step" or r.get("status") != "ok" or e is None or not stable(r):
            continue
        if _s(r.get("mode")) == "functional":
            continue
        impl = _s(r.get("impl"))
        if impl == "device" and (_s(r.get("ids_on")) or "device") != "device":
            continue
        by_impl.setdefault(impl, []).append(max(0.0, e))
    out: dict[str, float] = {}
    if by_impl.get("device"):
        out["hbm"] = statistics.median(by_impl["device"])
    host = [statistics.median(v) for k, v in by_impl.items() if k != "device" and v]
    if host:
        out["host"] = min(host)
    return out


def floor_of(metas: Sequence[dict[str, Any]]) -> float | None:
    """The fastest ``hbm_read_gbps`` ceiling of the runs (a lower bound on any step's time)."""
    vals = [as_meta(m).ceilings.hbm_read_gbps for m in metas]
    vals = [v for v in vals if v]
    return max(vals) if vals else None


def build_step_model(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]], model: ModelPreset,
                     models: dict[str, ModelPreset]) -> StepModel:
    floor = floor_of(metas)
    exposed = exposed_lookup_ms(records)
    samples = serve_samples(records, models)
    own = [s for s in samples if s.model == model.name]
    for pool, what in ((own, ""), (samples, " (every model's: too few of this one)")):
        m = fit_samples(pool, floor, exposed)
        if m is not None:
            m.source += what
            return m
    m = _decoder_model(records, floor, exposed)
    if m is not None:
        return m
    if floor:
        return StepModel(0.0, 1.0 / (floor * 1e6), exposed, floor,
                         "the hbm_read ceiling alone (no serve or decoder records in the runs): no fixed cost")
    raise ServingAdviseError("--runs: no serve records, no decoder steps and no hbm_read ceiling in the runs given: "
                             "nothing to measure or predict from (run the serving suite: "
                             "python -m ple_bench run --suite serving)")


# ---------------------------------------------------------------- hold-out error

@dataclass
class HoldOut:
    """The step model's error on measured serve steps it did not see."""

    what: str
    errors_pct: list[float] = field(default_factory=list)  # (predicted − measured) / measured × 100

    @property
    def n(self) -> int:
        return len(self.errors_pct)

    @property
    def median_pct(self) -> float | None:
        return statistics.median(abs(e) for e in self.errors_pct) if self.errors_pct else None

    @property
    def worst_pct(self) -> float | None:
        return max((abs(e) for e in self.errors_pct), default=None)

    def words(self) -> str:
        if not self.errors_pct:
            return f"{self.what}: not measured (too few measured serve steps)"
        return (f"{self.what}: median {self.median_pct:.1f} %, worst {self.worst_pct:.1f} % "
                f"over {self.n} held-out steps")

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "median_abs_pct": self.median_pct, "worst_abs_pct": self.worst_pct,
                "errors_pct": self.errors_pct}


def _held_out(train: Sequence[Sample], test: Sequence[Sample], floor: float | None,
              exposed: dict[str, float]) -> list[float]:
    m = fit_samples(train, floor, exposed)
    if m is None:
        return []
    return [100.0 * (m.step_ms(s.nbytes, s.placement, s.serve_batch) / s.step_ms - 1.0) for s in test]


def holdout_errors(samples: Sequence[Sample], floor: float | None,
                   exposed: dict[str, float] | None = None) -> tuple[HoldOut, HoldOut]:
    """Leave one batch out (each measured step, refitted on the others) and leave one context out
    (every step of one context length, refitted on the other contexts)."""
    exposed = exposed or {}
    batch = HoldOut("leave one batch out")
    for i, s in enumerate(samples):
        batch.errors_pct += _held_out([t for j, t in enumerate(samples) if j != i], [s], floor, exposed)
    context = HoldOut("leave one context out")
    contexts = sorted({s.context_len for s in samples})
    if len(contexts) > 1:
        for c in contexts:
            context.errors_pct += _held_out([s for s in samples if s.context_len != c],
                                            [s for s in samples if s.context_len == c], floor, exposed)
    return batch, context


# ---------------------------------------------------------------- the answer

@dataclass
class ServingAsk:
    model: ModelPreset
    context_len: int
    kv_dtype: str
    table_bytes: int
    dim: int
    dtype: str
    heads: int
    hbm_bytes: int | None = None
    host_bytes: int | None = None
    etp: int = 1
    tpot_ms: float | None = None
    gpu_memory_utilization: float = 0.90
    gpu: Gpu | None = None  # --gpu: the card to answer for (its memory, its datasheet)
    hbm_read_gbps: float | None = None  # --hbm-gbps: the target's achievable HBM read rate
    h2d_gbps: float | None = None  # --h2d-gbps: the target's host -> device rate
    table_words: str = ""  # where the table's shape came from when not asked (the model's default, the runs')


@dataclass
class ServingAdvice:
    answer: ServingAnswer
    capacities: dict[str, Capacity]
    sources: dict[str, str]  # placement -> measured | predicted | does not fit
    step_model: StepModel | None
    holdout: tuple[HoldOut, HoldOut]
    hbm_bytes: int
    notes: list[str] = field(default_factory=list)
    source_figures: Figures | None = None  # the runs' machine
    target_figures: Figures | None = None  # the machine answered for
    engine: dict[str, dict[str, Any]] = field(default_factory=dict)  # placement -> the engine setting's path
    warnings: list[str] = field(default_factory=list)  # printed under the answer (a literal HBM near a card's)
    terms: list[str] = field(default_factory=list)  # the step model in machine terms, in words

    def to_json(self) -> dict[str, Any]:
        a = self.answer
        out: dict[str, Any] = {"answer": a.sentence(), "verdict": a.verdict, "verdict_at_target": a.verdict_at_target,
                               "ratio_at_max": None if a.functional else a.at_max.ratio,
                               "ratio_at_target": None if a.functional else a.at_target.ratio,
                               "tpot_target_ms": a.tpot_ms, "hbm_bytes": self.hbm_bytes,
                               "scenario": {"model": a.scenario.model, "context_len": a.scenario.context_len,
                                            "kv_dtype": a.scenario.kv_dtype, "table_bytes": a.scenario.table_bytes},
                               "placements": {}}
        for pl in (a.host, a.hbm):
            top, slo = pl.at_max, pl.under(a.tpot_ms)
            cap = self.capacities[pl.placement]
            out["placements"][pl.placement] = {
                "serve_batch": top.serve_batch if top else 0,
                "tokens_per_s": top.tokens_per_s if top else None,
                "tpot_ms": top.tpot_ms if top else None,
                "source": self.sources[pl.placement],
                "at_target": None if slo is None else {"serve_batch": slo.serve_batch, "tokens_per_s": slo.tokens_per_s,
                                                       "tpot_ms": slo.tpot_ms, "source": slo.source},
                "capacity": {"budget_bytes": cap.budget_bytes, "weight_bytes": cap.weight_bytes,
                             "table_term_bytes": cap.table_term_bytes, "activation_bytes": cap.activation_bytes,
                             "kv_bytes_per_seq": cap.kv_bytes_per_seq, "max_batch": cap.max_batch,
                             "staging_bytes": cap.table_term_bytes if pl.placement == "host" else 0,
                             "reason": pl.reason or cap.reason, "explain": cap.explain()},
                "points": [{"serve_batch": p.serve_batch, "step_ms": p.step_ms, "tokens_per_s": p.tokens_per_s,
                            "tpot_ms": p.tpot_ms, "source": p.source, "case_id": p.case_id or None}
                           for p in pl.points],
                "engine_setting": ENGINE_SETTING[pl.placement]}
        out["engine_setting_source"] = ENGINE_SETTING_SOURCE
        out["engine"] = self.engine
        out["warnings"] = self.warnings
        out["machine"] = {"runs": self.source_figures.to_json() if self.source_figures else None,
                          "target": self.target_figures.to_json() if self.target_figures else None,
                          "terms": self.terms}
        out["step_model"] = self.step_model.to_json() if self.step_model else None
        out["holdout"] = {"leave_one_batch_out": self.holdout[0].to_json(),
                          "leave_one_context_out": self.holdout[1].to_json()}
        out["notes"] = self.notes
        return out


def _same_shape(r: dict[str, Any], ask: ServingAsk) -> bool:
    r = as_record(r)
    table = r.table_bytes
    return (r.kind == "serve" and r.model == ask.model.name and r.context_len == ask.context_len
            and (r.kv_dtype or "bf16") == ask.kv_dtype and r.dim == ask.dim and r.dtype == ask.dtype
            and r.num_heads == ask.heads
            and table is not None and table > 0 and abs(math.log(table / ask.table_bytes)) <= math.log(TABLE_SLACK)
            and abs((r.gpu_memory_utilization or 0.90) - ask.gpu_memory_utilization) < 1e-6
            and (r.etp or 1) == 1)


def run_hbm_bytes(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]]) -> int | None:
    """The HBM of the GPU the runs measured: the serve records' ``hbm_bytes_total`` (what their
    capacity rule started from), else meta.json ``device.memory_bytes``; the largest."""
    serve = [r for r in map(as_record, records) if r.kind == "serve" and r.hbm_bytes_total]
    gpu = [r for r in serve if r.mode != "functional"]
    devices = [d for d in (as_meta(m).device for m in metas) if d is not None]
    vals = [r.hbm_bytes_total for r in (gpu or serve)] or [d.memory_bytes for d in devices]
    vals = [v for v in vals if v]
    return int(max(vals)) if vals else None


def run_host_bytes(metas: Sequence[dict[str, Any]]) -> int | None:
    """The host memory of the machine the runs measured (meta.json ``device.host_memory_bytes``; the
    smallest)."""
    vals = [d.host_memory_bytes for d in (as_meta(m).device for m in metas) if d is not None]
    vals = [v for v in vals if v]
    return int(min(vals)) if vals else None


def served_capacity(ask: "ServingAsk", placement: str, hbm_bytes: int, host_bytes: int | None,
                    element_bytes: int = 2) -> Capacity:
    """The capacity rule as the serving suite applies it (:func:`ple_bench.run.serve.serve_capacity`,
    which needs a device: the same terms here for any HBM): the weights at the activation dtype plus
    the PLE projection (heads x dim x hidden), the table (hbm) or :data:`STAGING_COPIES` copies of one
    step's rows at the batch the rule gives without them (host)."""
    return _served(ask.model, placement=placement, context_len=ask.context_len, kv_dtype=ask.kv_dtype,
                   hbm_bytes=hbm_bytes, table_bytes=ask.table_bytes, heads=ask.heads, dim=ask.dim,
                   row_bytes=ask.dim * DTYPE_BYTES[ask.dtype], element_bytes=element_bytes, etp=ask.etp,
                   gpu_memory_utilization=ask.gpu_memory_utilization, host_bytes=host_bytes)


def one_gpus_runs(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]],
                  gpu: Gpu | None) -> tuple[list, list, str]:
    """The runs of one GPU where the runs span several (meta.json ``device.name``): the asked card's
    own where it has serve records, else the GPU with the most serve records; and the note saying so
    ("" where the runs are of one GPU).  One step model is fitted on one machine: the serve records of
    two GPUs in one fit read as neither's rate, and no term is carried."""
    names = {m.get("run_id"): str((m.get("device") or {}).get("name") or "") for m in metas}
    gpus_named = sorted({n for n in names.values() if n})
    if len(gpus_named) < 2:
        return list(records), list(metas), ""
    serve: dict[str, int] = {}
    for r in records:
        if r.get("kind") == "serve" and r.get("status") == "ok":
            n = names.get(r.get("_run_id"), "")
            serve[n] = serve.get(n, 0) + 1
    own = [n for n in gpus_named if gpu is not None and gpu_of_device(n) is not None
           and gpu_of_device(n).key == gpu.key and serve.get(n)]
    pick = own[0] if own else max(gpus_named, key=lambda n: (serve.get(n, 0), sum(v == n for v in names.values())))
    keep = {rid for rid, n in names.items() if n == pick}
    others = ", ".join(n for n in gpus_named if n != pick)
    return ([r for r in records if r.get("_run_id") in keep], [m for m in metas if m.get("run_id") in keep],
            f"runs: of several GPUs; answered from the {pick}'s ({len(keep)} runs"
            + (", the card asked for" if own else ", the most serve records") + f"), not the {others}'s "
            "(give --runs of one GPU to choose)")


def advise_serving(ask: ServingAsk, records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]],
                   models: dict[str, ModelPreset]) -> ServingAdvice:
    """The serving answer for ``ask`` from the runs' records (see the module's doc)."""
    records = [as_record(r) for r in records]  # typed once: the readers below take Records
    notes: list[str] = []
    records, metas, one_gpu = one_gpus_runs(records, metas, ask.gpu)
    if one_gpu:
        notes.append(one_gpu)
    warnings: list[str] = []
    measured_hbm = run_hbm_bytes(records, metas)
    hbm = ask.hbm_bytes or (ask.gpu.memory_bytes if ask.gpu else None) or measured_hbm
    if hbm is None:
        raise ServingAdviseError("--hbm-bytes: the runs name no GPU memory (meta.json device.memory_bytes); "
                                 "give the GPU (--gpu h100) or its HBM (--hbm-bytes 79.2GiB)")
    if ask.hbm_bytes is not None:
        near = near_card_words("--hbm-bytes", ask.hbm_bytes)
        if near:
            warnings.append(near)
    host_bytes = ask.host_bytes or run_host_bytes(metas)
    if host_bytes is None:
        notes.append("host memory unknown (no --host-bytes, no device.host_memory_bytes in the runs): "
                     "the table is assumed to fit it")
    elif ask.host_bytes is None:
        notes.append(f"host memory: {host_bytes / GIB:.1f} GiB, the runs' machine (--host-bytes for another)")
    # the machine: the runs' (of the serve records where there are some), and the one asked for
    serve_runs = {r.get("_run_id") for r in records if r.get("kind") == "serve"}
    src = runs_figures([m for m in metas if m.get("run_id") in serve_runs] or list(metas))
    tgt = target_figures(src, ask.gpu, hbm_read_gbps=ask.hbm_read_gbps, h2d_gbps=ask.h2d_gbps)
    same_card = ask.gpu is None or (src.gpu is not None and ask.gpu.key == src.gpu.key)
    same_gpu = (same_card and ask.hbm_read_gbps is None and ask.h2d_gbps is None
                and (ask.hbm_bytes is None or (measured_hbm is not None and abs(hbm - measured_hbm) <= 0.01 * hbm)))
    mine = [r for r in records if _same_shape(r, ask)] if same_gpu and ask.etp == 1 else []
    functional = any(_s(r.get("mode")) == "functional" for r in mine)
    element = 4 if functional else 2  # the serve step's activation dtype: fp32 on a CPU, bf16 on a GPU
    caps = {placement: served_capacity(ask, placement, hbm, host_bytes, element) for placement in PLACEMENTS}
    try:
        step_model: StepModel | None = build_step_model(records, metas, ask.model, models)
    except ServingAdviseError:
        if not mine:
            raise
        step_model = None  # every row must then be measured (below)
    sc = scales(src, tgt)
    fitted_floor = step_model.floor_gbps if step_model else None  # the runs' own: the hold-out is on their machine
    if step_model is not None:
        fps = matmul_flops_per_seq(ask.model)
        if not sc.identity:
            step_model = step_model.carried(sc, tgt, fps)
        elif src.bf16_tflops:
            step_model = replace(step_model, floor_tflops=src.bf16_tflops, flops_per_seq=fps)
    samples = serve_samples(records, models)
    own = [s for s in samples if s.model == ask.model.name]
    holdout = holdout_errors(own if len({s.nbytes for s in own}) >= 3 else samples,
                             fitted_floor, exposed_lookup_ms(records))

    curves: dict[str, Placement] = {}
    sources: dict[str, str] = {}
    for placement in PLACEMENTS:
        cap = caps[placement]
        if cap.max_batch < 1:  # the rule's reason, with its numbers
            curves[placement] = Placement(placement, (), 0, cap.reason or cap.explain())
            sources[placement] = "does not fit"
            continue
        measured = placement_of(mine, placement)
        if any(p.source == "measured" for p in measured.points):
            curves[placement] = measured
            sources[placement] = "measured"
            top = measured.at_max
            if top is not None and top.serve_batch != cap.max_batch:
                notes.append(f"{measured.name}: the run measured up to {top.serve_batch} sequences; the capacity "
                             f"rule gives {cap.max_batch} here")
            continue
        if step_model is None:
            raise ServingAdviseError(f"--runs: {PLACE[placement]} was not measured for this ask and nothing in the "
                                     "runs predicts it (no GPU serve records, decoder steps or hbm_read ceiling)")
        batches = sorted({serve_batch(cap, f) for f in FRACTIONS})
        pts = tuple(ServePoint(b, step_model.step_ms(bytes_read(ask.model, b, ask.context_len, ask.kv_dtype), placement,
                                                     b), "predicted", batch_fraction=b / cap.max_batch)
                    for b in batches)
        curves[placement] = Placement(placement, pts, cap.max_batch)
        sources[placement] = "predicted"
    if "predicted" in sources.values() and not same_gpu:
        notes.append(f"predicted for {hbm / GIB:.1f} GiB of HBM; the runs measured a "
                     f"{(measured_hbm or 0) / GIB:.1f} GiB GPU")
    if ask.etp > 1:
        notes.append(f"ETP {ask.etp}: the resident table term is table/{ask.etp}; measured serve records are of "
                     "ETP 1, so every row is predicted")
    scenario = Scenario(ask.model.name, ask.context_len, ask.kv_dtype, ask.table_bytes)
    if functional:
        notes.append("the measured rows are of a CPU functional run: they check the code paths, no verdict")
    answer = answer_for(scenario, curves["host"], curves["hbm"], ask.tpot_ms, functional=functional)
    if ask.table_words:
        notes.insert(0, ask.table_words)
    if not same_card and ask.gpu is not None:
        notes.append(f"every row predicted for the {ask.gpu.name} from runs on the {src.name}: the assumptions "
                     "are the step model's terms below (each figure's kind and source listed)")
    engine = engine_paths(curves, step_model, records, metas, ask, sc, tgt)
    terms = machine_terms(step_model, src, tgt, ask.model) if step_model is not None else []
    return ServingAdvice(answer, caps, sources, step_model, holdout, hbm, notes, src, tgt, engine, warnings, terms)


def uva_ms_per_row(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """What one row of the UVA lookup adds to a step: the median ``exposed_ms / rows`` of the runs'
    stable prefetched ``pinned_uva`` decode steps, else one row at the runs' pinned random-row ceiling,
    not hidden (an assumption)."""
    per = []
    for r in records:
        rows, e = as_record(r).rows, as_record(r).exposed_ms
        if (r.get("kind") == "step" and r.get("status") == "ok" and _s(r.get("impl")) == "pinned_uva"
                and _s(r.get("mode")) != "functional" and rows and e is not None and r.get("prefetch") and stable(r)):
            per.append(max(0.0, e) / rows)
    if per:
        return statistics.median(per), f"measured: median exposed lookup per row of {len(per)} prefetched UVA decode steps"
    rates = [as_meta(m).ceilings.pinned_random_row_rows_per_s for m in metas]
    rates = [v for v in rates if v]
    if rates:
        return 1e3 / statistics.median(rates), ("assumed: each row at the runs' pinned random-row ceiling, not hidden "
                                               "(no prefetched UVA decode step in the runs)")
    return None, "no UVA decode step and no pinned random-row ceiling in the runs"


def engine_paths(curves: dict[str, Placement], step_model: StepModel | None, records: Sequence[dict[str, Any]],
                 metas: Sequence[dict[str, Any]], ask: ServingAsk, sc: Scales, tgt: Figures) -> dict[str, dict[str, Any]]:
    """Per placement: the engine setting, the lookup path it really runs, that path's tokens/s at the
    placement's largest batch beside the best path's, and what the best path would take where it is
    no engine setting."""
    out: dict[str, dict[str, Any]] = {}
    for placement in PLACEMENTS:
        top = curves[placement].at_max
        best_tps = top.tokens_per_s if top else None
        e: dict[str, Any] = {"setting": ENGINE_SETTING[placement], "runs_impl": ENGINE_IMPL[placement],
                             "best_impl": MEASURED_IMPL[placement], "best_tokens_per_s": best_tps,
                             "tokens_per_s": best_tps, "step_ms": top.step_ms if top else None,
                             "serve_batch": top.serve_batch if top else 0, "source": top.source if top else "",
                             "best_is_engine_setting": ENGINE_IMPL[placement] == MEASURED_IMPL[placement]}
        if placement == "host" and top is not None:
            per_row, how = uva_ms_per_row(records, metas)
            rows = top.serve_batch * ask.heads
            if per_row is None:
                e.update(tokens_per_s=None, step_ms=None, source=how)
            else:
                row_bytes = ask.dim * DTYPE_BYTES[ask.dtype]
                lookup = rows * per_row * sc.link
                if tgt.h2d_gbps:  # no row moves faster than its bytes (at least a sector) over the link
                    lookup = max(lookup, rows * max(row_bytes, 64) / (tgt.h2d_gbps * 1e6))
                own = step_model.exposed_ms.get("host", 0.0) if step_model else 0.0
                step = top.step_ms - own + lookup
                e.update(step_ms=step, tokens_per_s=top.serve_batch / step * 1e3,
                         source=f"predicted: the host step with the UVA lookup's {lookup:.3f} ms for {rows} rows "
                                f"in place of the posted gather's {own:+.3f} ms ({how})")
        if placement == "host":
            e["what_it_would_take"] = POSTED_GATHER_NEEDS
        out[placement] = e
    return out


def machine_terms(m: StepModel, src: Figures, tgt: Figures, model: ModelPreset) -> list[str]:
    """The step model's terms, each over the figure that binds it, with the share achieved."""
    lines = []
    rate = m.rate_gbps
    fitted = rate * m.scales.hbm if rate else None
    if fitted:
        share = [f"{100 * fitted / src.hbm_gbps:.1f} % of the {src.name}'s {src.hbm_gbps:,.0f} GB/s datasheet peak"
                 if src.hbm_gbps else "",
                 f"{100 * fitted / src.hbm_read_gbps:.1f} % of its measured {src.hbm_read_gbps:,.0f} GB/s read ceiling"
                 if src.hbm_read_gbps else ""]
        lines.append(f"weights + KV bytes / achievable HBM: fitted {fitted:,.0f} GB/s on the runs' machine ("
                     + "; ".join(x for x in share if x) + f") -> {rate:,.0f} GB/s on the {tgt.name}")
    fps = matmul_flops_per_seq(model)
    if m.per_seq_ms:
        per_src = m.per_seq_ms / m.scales.flops
        eff = fps / (per_src * 1e9)  # TFLOP/s
        peak = src.bf16_tflops
        lines.append(f"matmul FLOPs / FLOP/s: {fps / 1e9:.1f} GFLOP per sequence ({model.name}) at "
                     f"{per_src * 1e3:.2f} us per sequence = {eff:,.0f} TFLOP/s"
                     + (f", {100 * eff / peak:.0f} % of the {peak:,.0f} TFLOP/s dense BF16 peak"
                        + (" (over 100 %: part of the matmuls hides under the byte stream)" if eff > peak else "")
                        if peak else "") + f" -> {m.per_seq_ms * 1e3:.2f} us per sequence on the {tgt.name}")
    host = m.exposed_ms.get("host")
    if host:
        lines.append(f"host gather rows / host link: the posted gather's exposed {host:+.4f} ms per step on the "
                     f"{tgt.name}" + (f" ({tgt.h2d_gbps:,.1f} GB/s host -> device, {tgt.kind('h2d_gbps')})"
                                      if tgt.h2d_gbps else ""))
    lines.append(f"fixed launch part: {m.fixed_ms:.3f} ms (assumed the same on any GPU)")
    lines += [f"carried: {w}" for w in m.carried_by]
    lines.append("figures of the machine answered for:")
    lines += [f"  {x}" for x in tgt.lines()]
    return lines


def _hbm_words(n: int) -> str:
    """HBM as the capacity rule prints it (139.8 GiB), small pretend HBM as format_bytes does."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else format_bytes(n)


def format_serving_text(a: ServingAdvice) -> str:
    ans = a.answer
    t, src = a.target_figures, a.source_figures
    gpu = ("" if t is None or src is None else f" ({t.name})" if t.name != src.name
           else f" (the rates of the runs' {src.name})")
    lines = [ans.sentence()] + [f"warning: {w}" for w in a.warnings] + ["",
             f"{ans.scenario.label}; {_hbm_words(a.hbm_bytes)} of HBM{gpu}; TPOT target {ans.tpot_ms:g} ms",
             f"  {'':<36} {'host':>16} {'HBM':>16} {'host/HBM':>9}"]
    for label, host, hbm, ratio in ans.table():
        lines.append(f"  {label:<36} {host:>16} {hbm:>16} {ratio:>9}")
    lines += ["", "where each figure comes from: " + ", ".join(f"{PLACE[p]} {s}" for p, s in a.sources.items()),
              "capacity (the largest batch: (HBM × utilization − weights − table term − activations) ÷ KV per sequence):"]
    for p in PLACEMENTS:
        lines.append(f"  {a.capacities[p].explain()}")
    lines.append("points (batch, step ms = TPOT, tokens/s, source):")
    for pl in (ans.host, ans.hbm):
        if not pl.points:
            lines.append(f"  {pl.name}: none ({pl.reason})")
        for p in pl.points:
            lines.append(f"  {pl.name:<4} {p.serve_batch:>6} {p.step_ms:>10.3f} {p.tokens_per_s:>12,.0f}  {p.source}"
                         + (f" ({p.case_id})" if p.case_id else ""))
    lines += ["", "step model: " + (a.step_model.words() if a.step_model else "none (every row is measured; nothing "
                                                                             "in the runs fits one)"),
              "its error on measured serving cases it did not see (on the runs' machine): "
              + "; ".join(h.words() for h in a.holdout)]
    if a.terms:
        lines += ["the step in machine terms (each term over the figure that binds it):"] + [f"  {t}" for t in a.terms]
    lines += ["", "the serving-engine setting that realises each placement, and the lookup path it runs:"]
    for p in PLACEMENTS:
        e = a.engine.get(p)
        lines.append(f"  {PLACE[p]}: {ENGINE_SETTING[p]}")
        if not e:
            continue
        if e["best_is_engine_setting"]:
            lines.append(f"    runs {e['runs_impl']}, the path measured here for this placement"
                         + (f": {e['tokens_per_s']:,.0f} tok/s at {e['serve_batch']} sequences"
                            if e["tokens_per_s"] else ""))
        else:
            uva = (f"{e['tokens_per_s']:,.0f} tok/s ({e['step_ms']:.2f} ms TPOT)" if e["tokens_per_s"]
                   else "not predictable from these runs")
            best = f"{e['best_tokens_per_s']:,.0f} tok/s" if e["best_tokens_per_s"] else "n/a"
            if not e["serve_batch"]:
                uva = "no sequence fits"
            lines.append(f"    runs the UVA lookup ({e['runs_impl']}): {uva} at {e['serve_batch']} sequences, "
                         f"beside {best} for the best path measured, the posted host gather ({e['best_impl']})")
            lines.append(f"    ({e['source']})")
            lines.append(f"    {e['what_it_would_take']}")
    lines.append(f"  ({ENGINE_SETTING_SOURCE})")
    lines += [f"note: {n}" for n in a.notes]
    return "\n".join(lines)

__all__ = ["ServingAsk", "ServingAdvice", "ServingAdviseError", "StepModel", "HoldOut", "advise_serving",
           "format_serving_text", "holdout_errors", "build_step_model", "bytes_read", "ENGINE_SETTING"]
