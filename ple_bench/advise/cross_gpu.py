"""advise's error across GPUs: one GPU's serve records and decode steps predicted from another GPU's
runs alone (``scripts/gpu_error.py``; the tables of docs/advise.md, "Another GPU").

* **serve**: each measured serve scenario (model, context, KV dtype, table) of the target GPU, at each
  placement's largest measured batch: ``advise --model ... --gpu <its preset>`` answered from the other
  GPU's runs (the capacity rule on the target card's reported memory, the step model carried term by
  term: :mod:`ple_bench.advise.serve_machine`), tokens/s and TPOT at the predicted largest batch against
  the measured ones, and the step at the measured batch (the step model's error alone);
* **steps**: the target's decode steps predicted by the per-step model fitted on the other GPU's steps,
  with the target's measured ceilings as the machine (:func:`ple_bench.advise.model.heldout_runs`), and
  each pinned step's verdict against its resident baseline (faster / as fast / slower, ±5 %) predicted
  against measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .gpus import gpu_of_device
from .machine import measured_machine
from .model import build_model, changed_configuration, heldout_runs, step_points
from .serving import ServingAsk, ServingAdviseError, advise_serving, bytes_read
from ..run_meta import as_meta
from ..serving.models import MODELS

#: the band of the per-step verdict (the lookup verdict's ±5 %)
BAND = 0.05


def gpu_name(meta: Mapping[str, Any]) -> str:
    device = as_meta(meta).device
    return device.name if device is not None and device.name else "unknown GPU"


@dataclass
class ServeRow:
    context: int
    placement: str
    model: str
    measured_batch: int
    predicted_batch: int
    measured_tpot: float
    predicted_tpot: float
    measured_tps: float
    predicted_tps: float
    tpot_at_measured_batch: float

    def err(self, what: str) -> float:
        pred, meas = {"tpot": (self.predicted_tpot, self.measured_tpot), "tps": (self.predicted_tps, self.measured_tps),
                      "step": (self.tpot_at_measured_batch, self.measured_tpot)}[what]
        return 100.0 * (pred / meas - 1.0)


def serve_rows(train: tuple[list, list], test: tuple[list, list]) -> list[ServeRow]:
    """The target's serve scenarios at each placement's largest measured batch, predicted from ``train``."""
    records, metas = test
    metas_by_run = {m.get("run_id"): m for m in metas}
    top: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") != "serve" or r.get("status") != "ok" or r.get("mode") == "functional":
            continue
        key = (r.get("model"), int(r.get("context_len")), r.get("kv_dtype") or "bf16", int(r.get("table_bytes")),
               int(r.get("dim")), str(r.get("dtype")), int(r.get("num_heads")), r.get("placement"),
               float(r.get("gpu_memory_utilization") or 0.9))
        if key not in top or int(r.get("serve_batch")) > int(top[key].get("serve_batch")):
            top[key] = r
    out = []
    for (model, ctx, kv, table, dim, dtype, heads, placement, util), r in sorted(top.items(), key=lambda kv: str(kv[0])):
        preset = MODELS.get(model)
        gpu = gpu_of_device(gpu_name(metas_by_run.get(r.get("_run_id"), {})))
        if preset is None:
            continue
        ask = ServingAsk(model=preset, context_len=ctx, kv_dtype=kv, table_bytes=table, dim=dim, dtype=dtype,
                         heads=heads, hbm_bytes=int(r.get("hbm_bytes_total") or 0) or None, gpu=gpu,
                         gpu_memory_utilization=util)
        try:
            adv = advise_serving(ask, *train, MODELS)
        except ServingAdviseError:
            continue
        pl = adv.answer.host if placement == "host" else adv.answer.hbm
        p = pl.at_max
        if p is None or adv.step_model is None:
            continue
        b = int(r["serve_batch"])
        at_b = adv.step_model.step_ms(bytes_read(preset, b, ctx, kv), placement, b)
        out.append(ServeRow(ctx, placement, model, b, p.serve_batch, float(r["step_ms"]), p.step_ms,
                            b / float(r["step_ms"]) * 1e3, p.tokens_per_s, at_b))
    return out


def _stats(errs: Sequence[float]) -> str:
    a = [abs(e) for e in errs]
    return f"median {statistics.median(a):.1f} %, worst {max(a):.1f} % ({len(a)})" if a else "none"


def serve_markdown(rows: Sequence[ServeRow], source: str, target: str) -> str:
    lines = [f"#### Serve: the {target} predicted from {source} runs alone", "",
             "| context | placement | batch measured / predicted | TPOT ms measured | predicted | error "
             "| tok/s measured | predicted | error | TPOT at the measured batch, error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.context // 1024} K | {r.placement} | {r.measured_batch} / {r.predicted_batch} "
                     f"| {r.measured_tpot:.2f} | {r.predicted_tpot:.2f} | {r.err('tpot'):+.1f} % "
                     f"| {r.measured_tps:,.0f} | {r.predicted_tps:,.0f} | {r.err('tps'):+.1f} % | {r.err('step'):+.1f} % |")
    lines += ["", f"tok/s: {_stats([r.err('tps') for r in rows])}; TPOT: {_stats([r.err('tpot') for r in rows])}; "
                  f"the step at the measured batch: {_stats([r.err('step') for r in rows])}"]
    return "\n".join(lines)


def _verdict(ratio: float) -> str:
    return "faster" if ratio < 1 - BAND else "as fast" if ratio <= 1 + BAND else "slower"


def step_markdown(train: tuple[list, list], test: tuple[list, list], source: str, target: str) -> str:
    """The target's decode steps and per-step verdicts predicted from the source's steps."""
    model = build_model(*train, loo=False)
    rates = model.rates
    same = [p for p in model.points if changed_configuration(p, rates) is None]
    new_pts = [p for p in step_points(test[0]) if changed_configuration(p, rates) is None]
    machine = measured_machine(test[1])
    cases = heldout_runs(same, rates, new_pts, machine)
    lines = [f"#### Decode steps: the {target} predicted from {source} runs alone (the {target}'s measured "
             "ceilings as the machine)", ""]
    if not cases:
        return "\n".join(lines + ["no decode step of a path both GPUs measured"])
    errs = [100.0 * (c.predicted_ms / c.measured_ms - 1.0) for c in cases]
    lines.append(f"steps: {_stats(errs)}")
    by_id = {c.case_id: c for c in cases}
    flips, agree = [], 0
    for r in test[0]:
        base = by_id.get(str(r.get("offload_baseline")))
        mine = by_id.get(str(r.get("case_id")))
        if r.get("kind") != "step" or base is None or mine is None or mine is base:
            continue
        measured = _verdict(mine.measured_ms / base.measured_ms)
        predicted = _verdict(mine.predicted_ms / base.predicted_ms)
        if measured == predicted:
            agree += 1
        else:
            flips.append(f"{r.get('case_id')}: measured {measured} ({mine.measured_ms / base.measured_ms:.3f}), "
                         f"predicted {predicted} ({mine.predicted_ms / base.predicted_ms:.3f})")
    lines.append(f"per-step verdicts (pinned / resident, ±{BAND:.0%}): {agree} of {agree + len(flips)} agree")
    lines += [f"- {f}" for f in flips[:20]] + ([f"- ... {len(flips) - 20} more"] if len(flips) > 20 else [])
    return "\n".join(lines)


def by_gpu(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]]) -> dict[str, tuple[list, list]]:
    """The runs split by the GPU their meta.json names."""
    names = {m.get("run_id"): gpu_name(m) for m in metas}
    out: dict[str, tuple[list, list]] = {}
    for m in metas:
        out.setdefault(gpu_name(m), ([], []))[1].append(m)
    for r in records:
        out[names.get(r.get("_run_id"), "unknown GPU")][0].append(r)
    return out
