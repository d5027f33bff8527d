"""advise's error across GPUs: one GPU's serve records and decode steps predicted from another GPU's
runs alone (``scripts/gpu_error.py``; the tables of docs/advise.md, "Another GPU").

* **serve**: each measured serve scenario (model, context, KV dtype, table) of the target GPU, at each
  placement's largest measured batch: ``advise --model ... --gpu <its preset>`` answered from the other
  GPU's runs (the capacity rule on the target card's reported memory, the step model carried term by
  term: :mod:`ple_bench.advise.serve_machine`; the card's memory from its preset, as ``--gpu`` takes
  it), tokens/s and TPOT at the predicted largest batch against the measured ones (the median over the
  target's runs), the step at the measured batch (the step model's error alone), and the host / HBM
  tokens/s ratio;
* **steps**: the target's decode steps predicted by the per-step model fitted on the other GPU's steps,
  with the target's measured ceilings as the machine (:func:`ple_bench.advise.model.heldout_runs`):
  the cases both GPUs measured (each the median over the target's runs), apart from the target's cases
  the source never measured (where the model extrapolates); and each pinned step's verdict against its
  resident baseline on the baseline's own timer (faster / as fast / slower, ±5 %) predicted against
  measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .gpus import gpu_of_device
from .machine import measured_machine
from .model import build_model, changed_configuration, heldout_runs, step_points
from ..record import as_record, device_resident
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
    tied: dict[tuple, list[float]] = {}
    for r in records:
        if r.get("kind") != "serve" or r.get("status") != "ok" or r.get("mode") == "functional":
            continue
        key = (r.get("model"), int(r.get("context_len")), r.get("kv_dtype") or "bf16", int(r.get("table_bytes")),
               int(r.get("dim")), str(r.get("dtype")), int(r.get("num_heads")), r.get("placement"),
               float(r.get("gpu_memory_utilization") or 0.9))
        if key not in top or int(r.get("serve_batch")) > int(top[key].get("serve_batch")):
            top[key] = r
            tied[key] = []
        if int(r.get("serve_batch")) == int(top[key].get("serve_batch")):
            tied[key].append(float(r["step_ms"]))  # every run's step at the largest batch: their median
    out = []
    for (model, ctx, kv, table, dim, dtype, heads, placement, util), r in sorted(top.items(), key=lambda kv: (str(kv[0][0]), kv[0][1], str(kv[0][2:]))):
        preset = MODELS.get(model)
        gpu = gpu_of_device(gpu_name(metas_by_run.get(r.get("_run_id"), {})))
        if preset is None:
            continue
        ask = ServingAsk(model=preset, context_len=ctx, kv_dtype=kv, table_bytes=table, dim=dim, dtype=dtype,
                         heads=heads, hbm_bytes=None if gpu else int(r.get("hbm_bytes_total") or 0) or None, gpu=gpu,
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
        measured = statistics.median(tied[(model, ctx, kv, table, dim, dtype, heads, placement, util)])
        out.append(ServeRow(ctx, placement, model, b, p.serve_batch, measured, p.step_ms,
                            b / measured * 1e3, p.tokens_per_s, at_b))
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
    ratios = host_hbm_ratios(rows)
    if ratios:
        lines += ["", "| context | host / HBM tok/s measured | predicted | error |", "| --- | --- | --- | --- |"]
        lines += [f"| {c // 1024} K | {m:.2f}x | {p:.2f}x | {100.0 * (p / m - 1.0):+.1f} % |" for c, m, p in ratios]
        lines += ["", f"host / HBM ratio: {_stats([100.0 * (p / m - 1.0) for _, m, p in ratios])}"]
    return "\n".join(lines)


def host_hbm_ratios(rows: Sequence[ServeRow]) -> list[tuple[int, float, float]]:
    """(context, measured, predicted) host / HBM tokens/s at each placement's largest batch, where a
    scenario has both."""
    by: dict[tuple, dict[str, ServeRow]] = {}
    for r in rows:
        by.setdefault((r.model, r.context), {})[r.placement] = r
    return [(ctx, d["host"].measured_tps / d["hbm"].measured_tps, d["host"].predicted_tps / d["hbm"].predicted_tps)
            for (_, ctx), d in sorted(by.items(), key=lambda kv: kv[0][1]) if {"host", "hbm"} <= set(d)]


def _verdict(ratio: float) -> str:
    return "faster" if ratio < 1 - BAND else "as fast" if ratio <= 1 + BAND else "slower"


def _per_run_ms(records: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Each step case's ``step_ms`` in every run that measured it (the resident steps' timer / graph
    twins too, as :func:`step_points` names them)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        runs.setdefault(str(r.get("_run_id", "")), []).append(r)
    out: dict[str, list[float]] = {}
    for recs in runs.values():
        for p in step_points(recs):
            out.setdefault(p.case_id, []).append(p.step_ms)
    return out


@dataclass
class VerdictRow:
    """One pinned step against its resident baseline, measured (the median over the target's runs of
    each run's own ratio) and predicted (the two predicted steps' ratio)."""

    case_id: str
    tokens: int
    measured_ms: float
    predicted_ms: float
    base_measured_ms: float
    base_predicted_ms: float
    measured_ratio: float
    predicted_ratio: float
    runs: int

    @property
    def agree(self) -> bool:
        return _verdict(self.measured_ratio) == _verdict(self.predicted_ratio)


@dataclass
class StepCompare:
    both: list  # LooCase of the cases both GPUs measured, measured_ms the median over the target's runs
    only_target: list  # LooCase of the target's cases the source never measured (the model extrapolates)
    verdicts: list[VerdictRow]


def step_compare(train: tuple[list, list], test: tuple[list, list]) -> StepCompare:
    """The target's decode steps predicted by the per-step model fitted on the source's steps, with
    the target's measured ceilings as the machine.  A case's measured step is the median over every
    target run that measured it (not the newest run alone); a pinned step's verdict is held against
    its resident baseline on the baseline's own timer and graph (``offload_baseline_timer`` /
    ``_graph``: a host-timed pinned step against the resident step's host-sync twin)."""
    model = build_model(*train, loo=False)
    rates = model.rates
    same = [p for p in model.points if changed_configuration(p, rates) is None]
    source_ids = {p.case_id for p in same}
    new_pts = [p for p in step_points(test[0]) if changed_configuration(p, rates) is None]
    cases = heldout_runs(same, rates, new_pts, measured_machine(test[1]))
    per_run = _per_run_ms(test[0])
    for c in cases:
        c.measured_ms = statistics.median(per_run.get(c.case_id) or [c.measured_ms])
    both = [c for c in cases if c.case_id in source_ids]
    only = [c for c in cases if c.case_id not in source_ids]
    by_id = {c.case_id: c for c in both}
    ratios: dict[str, list[float]] = {}
    first: dict[str, dict[str, Any]] = {}
    for r in map(as_record, test[0]):
        cid, base_ms, step = str(r.case_id), r.offload_baseline_ms, r.step_ms
        if (r.get("kind") != "step" or r.get("status") != "ok" or not r.get("offload_baseline") or not base_ms
                or not step or cid not in by_id or device_resident(r)):
            continue
        ratios.setdefault(cid, []).append(step / base_ms)
        first.setdefault(cid, r)
    rows = []
    for cid, r in first.items():
        mine, base_id = by_id[cid], str(r.get("offload_baseline"))
        timer, graph = r.get("offload_baseline_timer"), r.get("offload_baseline_graph")
        base = [c for c in both if c.case_id.split("#")[0] == base_id
                and (not timer or c.timer == timer) and (not graph or c.graph == graph)]
        if not base:
            continue
        b = base[0]
        rows.append(VerdictRow(cid, r.num_tokens or 0, mine.measured_ms, mine.predicted_ms,
                               b.measured_ms, b.predicted_ms, statistics.median(ratios[cid]),
                               mine.predicted_ms / b.predicted_ms, len(ratios[cid])))
    return StepCompare(both, only, sorted(rows, key=lambda v: (v.tokens, v.case_id)))


def _errs(cases: Sequence[Any]) -> list[float]:
    return [100.0 * (c.predicted_ms / c.measured_ms - 1.0) for c in cases]


def step_markdown(train: tuple[list, list], test: tuple[list, list], source: str, target: str) -> str:
    """The target's decode steps and per-step verdicts predicted from the source's steps."""
    sc = step_compare(train, test)
    lines = [f"#### Decode steps: the {target} predicted from {source} runs alone (the {target}'s measured "
             "ceilings as the machine)", ""]
    if not sc.both and not sc.only_target:
        return "\n".join(lines + ["no decode step of a path both GPUs measured"])
    if sc.verdicts:
        lines += ["| tokens | pinned ms measured / predicted | resident ms measured / predicted "
                  "| pinned / resident measured | predicted | verdict measured / predicted |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for v in sc.verdicts:
            lines.append(f"| {v.tokens} | {v.measured_ms:.4f} / {v.predicted_ms:.4f} "
                         f"| {v.base_measured_ms:.4f} / {v.base_predicted_ms:.4f} | {v.measured_ratio:.3f} "
                         f"({v.runs} runs) | {v.predicted_ratio:.3f} | {_verdict(v.measured_ratio)} / "
                         f"{_verdict(v.predicted_ratio)} |")
        lines.append("")
    agree = sum(v.agree for v in sc.verdicts)
    lines.append(f"per-step verdicts (pinned / resident, ±{BAND:.0%}): {agree} of {len(sc.verdicts)} agree; "
                 f"the ratio's error: {_stats([100.0 * (v.predicted_ratio / v.measured_ratio - 1.0) for v in sc.verdicts])}")
    lines.append(f"steps both GPUs measured: {_stats(_errs(sc.both))}")
    if sc.only_target:
        lines.append(f"steps of the {target} of a shape or path no {source} run measured (the model extrapolates): "
                     f"{_stats(_errs(sc.only_target))}")
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
