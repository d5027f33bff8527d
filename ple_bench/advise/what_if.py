"""The what-if half of ``advise``: every path the runs measured, priced by the model
(:mod:`ple_bench.advise.model`) at exactly the asked shape -- table size, tokens, compute, ETP
group, nodes, host cores -- ranked, each number labelled *measured* (that very case was measured)
or *predicted* (with its path's leave-one-out and extrapolation errors; marked *extrapolated*
past the path's measured rows and *at a floor* where a floor raised it), each pinned row's overhead
against the resident row a server would run instead (named beside it), plus the token count and
compute at which the recommendation would flip ("what would change it")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .machine import Machine
from .model import GIB, Model, PathFit, Point, path_id, path_label, predict

#: an overhead up to this (in %) counts as "as fast as the resident table" (as advise.EQUAL_PCT)
EQUAL_PCT = 5.0


@dataclass
class WhatIf:
    etp: int = 1
    nodes: int = 1
    link_gbps: float | None = None
    link_latency_us: float = 0.0
    host_cores: int | None = None
    #: the machine asked for (None: the one the runs measured); its rate terms scale the model's
    machine: Machine | None = None


@dataclass
class ModelOption:
    placement: str  # "HBM" | "HBM hot-row cache + pinned host" | "pinned host"
    path: str
    prefetch: bool
    ids_on: str
    graph: str
    step_ms: float
    overhead_pct: float | None  # vs ``baseline_step_ms`` (the resident row a server would run instead)
    source: str  # "measured" | "predicted"
    error: str  # the path's leave-one-out error, in words ("" when measured)
    error_median_pct: float | None
    error_worst_pct: float | None
    fits: bool
    run_id: str = ""
    case_id: str = ""
    lookup_ms: float | None = None
    exposed_ms: float | None = None
    reduce_ms: float | None = None
    outside: list[str] = field(default_factory=list)
    timer: str = ""
    ids: str = ""  # the id distribution
    host_alloc: str = ""
    checked: bool = True  # measured, or its path's own error was measured (only these are recommended)
    path_id: str = ""  # the path, every part of its key (model.path_id)
    extrapolated: bool = False  # predicted at rows outside the path's measured row range
    floors: list[str] = field(default_factory=list)  # the floors that raised the prediction
    extrap_error: str = ""  # the path's extrapolation error, in words
    extrap_median_pct: float | None = None
    extrap_worst_pct: float | None = None
    baseline: str = ""  # the resident row overhead_pct is against (its path_id); "" for none
    baseline_step_ms: float | None = None
    baseline_note: str = ""  # where that row is not the exact twin (ids on the device, same distribution)
    compute_ms: float | None = None  # the step's compute (its floor: a step is never shorter)
    lookup_floor_ms: float | None = None  # the predicted lookup's floor (physical / smallest measured)
    compute: str = "matmul"  # the compute kind of its path (model.PathKey.compute)


@dataclass
class ModelTokenAnswer:
    tokens: int
    options: list[ModelOption]
    recommendation: str
    choice: str  # "HBM" | "pinned host" | "none"


@dataclass
class ModelAdvice:
    what_if: dict[str, Any]
    answers: list[ModelTokenAnswer]
    verdict: str
    what_would_change: list[str]
    loo_overall: dict[str, Any]
    rates: dict[str, Any]
    assumptions: list[str]
    extrap_overall: dict[str, Any] = field(default_factory=dict)
    shape_overall: dict[str, Any] = field(default_factory=dict)  # the held-out-shape error (the headline)
    machine: dict[str, Any] = field(default_factory=dict)  # the machine predicted for, each figure's source
    machine_lines: list[str] = field(default_factory=list)


def _placement(fit: PathFit) -> str:
    if fit.resident:
        return "HBM"
    return "HBM hot-row cache + pinned host" if fit.key[6] else "pinned host"


def _measured(model: Model, fit: PathFit, rows: int, table_bytes: int, compute_us: float,
              w: WhatIf, row_bytes: int, heads: int) -> Point | None:
    if w.etp != 1 or w.host_cores or model.rates.machine.differs(w.machine):
        return None
    for p in model.points:
        if (p.key == fit.key and p.rows == rows and p.compute_us == compute_us and p.row_bytes == row_bytes
                and (not p.heads or p.heads == heads) and abs(math.log(p.table_bytes / table_bytes)) < 0.02):
            return p
    return None


def resident_baseline(o: ModelOption, resident: Sequence[ModelOption]) -> tuple[ModelOption | None, str]:
    """The resident row a server would run instead of ``o``: ids on the device, ``o``'s timer and
    id distribution and compute kind, the fastest of its graph modes and kernels; (row, "") -- or (None,
    why) where the runs hold no such row (never a row of another timer, ids placement, distribution or
    compute kind)."""
    cands = [r for r in resident if r.timer == o.timer and r.ids_on == "device" and r.ids == o.ids
             and r.compute == o.compute]
    if not cands:
        return None, f"no resident step with ids on the device, {o.ids} ids, on the {o.timer} timer: no comparison"
    return min(cands, key=lambda r: r.step_ms), ""


def options_at(model: Model, *, tokens: int, heads: int, table_bytes: int, compute_us: float, w: WhatIf,
               hbm_bytes: int | None, host_bytes: int | None, row_bytes: int,
               graph_modes: str = "replayed", ids: str | None = None) -> list[ModelOption]:
    """Every fitted path at the asked point; ``ids``: only the paths of that id distribution (the
    traffic the answer holds for: another's resident steps are never a pinned row's baseline)."""
    rows = tokens * heads
    fits = [f for f in model.fits.values() if ids is None or (f.key[9] or "uniform") == ids]
    if graph_modes == "replayed" and any(f.key[4] != "eager" for f in fits):
        fits = [f for f in fits if f.key[4] != "eager"]
    shard = table_bytes / w.etp
    host_share = table_bytes / w.nodes
    out = []
    for f in fits:
        m = _measured(model, f, rows, table_bytes, compute_us, w, row_bytes, heads)
        extrapolated, floors, lookup_floor = False, [], None
        if m is not None:
            step, lookup, exposed, red, outside = m.step_ms, m.lookup_ms, m.step_ms - m.compute_ms, 0.0, []
            compute = m.compute_ms
        else:
            pr = predict(f, model.rates, rows=rows, table_bytes=table_bytes, compute_us=compute_us, etp=w.etp,
                         nodes=w.nodes, link_gbps=w.link_gbps, link_latency_us=w.link_latency_us,
                         host_cores=w.host_cores, row_bytes=row_bytes, machine=w.machine, tokens=tokens)
            step, lookup, exposed, red, outside = pr.step_ms, pr.lookup_ms, pr.exposed_ms, pr.reduce_ms, pr.outside
            extrapolated, floors, compute, lookup_floor = pr.extrapolated, pr.floors, pr.compute_ms, pr.lookup_floor_ms
        if f.resident:
            ok = hbm_bytes is None or shard <= hbm_bytes
        else:
            cache = f.key[6] * row_bytes
            ok = (host_bytes is None or host_share <= host_bytes) and (hbm_bytes is None or cache <= hbm_bytes)
        err, ext = model.error(f.key), model.extrap_error(f.key)
        out.append(ModelOption(
            placement=_placement(f), path=path_label(f.key), prefetch=bool(f.key[2]), ids_on=f.key[3],
            graph=f.key[4], step_ms=step, overhead_pct=None, source="measured" if m else "predicted",
            error="" if m else err.text(), error_median_pct=None if m else err.median_pct,
            error_worst_pct=None if m else err.worst_pct, fits=ok, run_id=m.run_id if m else "",
            case_id=m.case_id if m else "", lookup_ms=lookup, exposed_ms=exposed, reduce_ms=red or None,
            outside=outside, timer=f.key.timer, ids=f.key.ids, host_alloc=f.key.host_alloc, path_id=path_id(f.key),
            checked=m is not None or err.scope == "path" or ext.scope == "path",
            extrapolated=extrapolated, floors=floors, extrap_error="" if m else ext.text(),
            extrap_median_pct=None if m else ext.median_pct, extrap_worst_pct=None if m else ext.worst_pct,
            compute_ms=compute, lookup_floor_ms=lookup_floor, compute=f.key.compute))
    resident = [o for o in out if o.placement == "HBM"]
    for o in out:
        if o.placement == "HBM":
            continue
        base, o.baseline_note = resident_baseline(o, resident)
        if base is not None:
            o.baseline, o.baseline_step_ms = base.path_id, base.step_ms
            o.overhead_pct = 100.0 * (o.step_ms / base.step_ms - 1)
    out.sort(key=lambda o: (not o.fits, o.step_ms))
    return out


def _tag(o: ModelOption) -> str:
    """How far to trust ``o``'s number, in words."""
    if o.source == "measured":
        return "measured"
    out = f"predicted; {o.error}"
    if o.extrapolated:
        out += f"; extrapolated past the measured rows, {o.extrap_error}"
    if o.floors:
        out += "; at a floor: " + ", ".join(o.floors)
    return out


def _decide(options: Sequence[ModelOption], table_gib: float) -> tuple[str, str, list[ModelOption]]:
    """(choice, recommendation in words, the options that decided it: the best of each side).
    Only checked options decide (measured, or their path's own error measured) where any is."""
    row = {id(o): i for i, o in enumerate(options, 1)}  # the row numbers the model's table prints
    options = [o for o in options if o.checked] or list(options)
    hbm = [o for o in options if o.placement == "HBM" and o.fits]
    pinned = sorted((o for o in options if o.placement != "HBM" and o.fits and o.overhead_pct is not None),
                    key=lambda o: o.overhead_pct)
    if not hbm and not pinned:
        return "none", "no measured path fits the budgets", []
    best_hbm = min(hbm, key=lambda o: o.step_ms) if hbm else None
    deciding = [o for o in (best_hbm, pinned[0] if pinned else None) if o is not None]
    if pinned and (not hbm or pinned[0].overhead_pct <= EQUAL_PCT):
        b = pinned[0]
        why = ("the table does not fit the HBM budget" if not hbm else
               f"within {EQUAL_PCT:.0f} % of HBM — frees {table_gib:.1f} GiB of HBM")
        return "pinned host", (f"{b.placement}: #{row[id(b)]} {b.path}, ids on the {b.ids_on}, {b.graph}, prefetch "
                               f"{'on' if b.prefetch else 'off'}, {b.timer}: {b.step_ms:.3f} ms, "
                               f"{b.overhead_pct:+.0f} % over HBM ({b.baseline_step_ms:.3f} ms) ({_tag(b)}); {why}"), \
            deciding
    txt = (f"HBM: #{row[id(best_hbm)]} {best_hbm.path}, {best_hbm.graph}, {best_hbm.timer}, {best_hbm.step_ms:.3f} ms "
           f"({_tag(best_hbm)})")
    if pinned:
        b = pinned[0]
        checked = " checked" if len(options) < len(row) else ""
        txt += (f"; the best{checked} pinned row (#{row[id(b)]} {b.path}, ids on the {b.ids_on}, {b.graph}, "
                f"{b.timer}: {b.step_ms:.3f} ms) costs {b.overhead_pct:+.0f} % over its HBM row "
                f"({b.baseline_step_ms:.3f} ms)")
    return "HBM", txt, deciding


def _choose(options: Sequence[ModelOption], table_gib: float) -> tuple[str, str]:
    """(choice, recommendation in words)."""
    return _decide(options, table_gib)[:2]


def _decide_at(model: Model, tokens: int, compute_us: float, kw: dict[str, Any]) -> tuple[str, list[ModelOption]]:
    opts = options_at(model, tokens=tokens, compute_us=compute_us, **kw)
    choice, _txt, deciding = _decide(opts, kw["table_bytes"] / GIB)
    return choice, deciding


def _choice_at(model: Model, tokens: int, compute_us: float, kw: dict[str, Any]) -> str:
    return _decide_at(model, tokens, compute_us, kw)[0]


def _flip_tokens(model: Model, lo: int, hi: int, compute_us: float, kw: dict[str, Any]) -> int:
    """The smallest token count in (lo, hi] whose choice differs from lo's (bisection)."""
    base = _choice_at(model, lo, compute_us, kw)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _choice_at(model, mid, compute_us, kw) == base:
            lo = mid
        else:
            hi = mid
    return hi


def _extrapolated(deciding: Sequence[ModelOption]) -> str:
    """'' when no deciding option is extrapolated; else the mark with the measured extrapolation
    error of those paths beside it."""
    ext = [o for o in deciding if o.extrapolated]
    if not ext:
        return ""
    errs = "; ".join(f"{o.path} ({o.timer}): {o.extrap_error}" for o in ext)
    return f"EXTRAPOLATED past the measured rows of {errs}"


def what_would_change(model: Model, tokens: Sequence[int], compute_us: float, kw: dict[str, Any],
                      compute_words: str | None = None) -> list[str]:
    """The token counts (1 to 16 K) and the compute lengths (0 to 2 000 us) at which the choice
    flips; a flip decided by a prediction past its path's measured rows is marked extrapolated,
    with that path's extrapolation error.  ``compute_words``: a compute that is not a matmul chain's
    length (decoder layers, in words): the token scan only, said to be at that compute."""
    at_compute = compute_words or f"{compute_us:g} us of compute"
    out = []
    # tokens: scan a doubling grid from 1 to 16 K tokens per step
    grid = sorted({2 ** i for i in range(15)} | set(tokens))
    choices = [(t, _choice_at(model, t, compute_us, kw)) for t in grid]
    for (t0, c0), (t1, c1) in zip(choices, choices[1:]):
        if c0 != c1:
            t = _flip_tokens(model, t0, t1, compute_us, kw)
            choice, deciding = _decide_at(model, t, compute_us, kw)
            mark = _extrapolated(deciding)
            out.append(f"from {_n(t)} tokens per step, {choice} wins (predicted at {at_compute}"
                       + (f"; {mark})" if mark else ")"))
    if not out:
        out.append(f"{choices[0][1]} at every token count from 1 to {_n(grid[-1])} (predicted at {at_compute})")
    if compute_words:  # decoder layers: their time is measured, not a length to scan
        return out
    # compute: for each asked token count, the compute at which the choice flips (0 .. 2 000 us)
    for t in tokens:
        here = _choice_at(model, t, compute_us, kw)
        steps = [c for c in range(0, 2001, 25)]
        flips = [c for c in steps if _choice_at(model, t, float(c), kw) != here]
        if not flips:
            continue
        above = [c for c in flips if c > compute_us]
        below = [c for c in flips if c < compute_us]
        at = min(above) if above else max(below) if below else None
        if at is None:
            continue
        choice, deciding = _decide_at(model, t, float(at), kw)
        mark = _extrapolated(deciding)
        mark = f"; {mark}" if mark else ""
        if above:
            out.append(f"at {t} tokens: with {at} us or more of compute between the lookup's issue and its "
                       f"use, {choice} wins (predicted{mark})")
        else:
            out.append(f"at {t} tokens: with {at} us or less of compute, {choice} wins (predicted{mark})")
    return out


def _n(n: int) -> str:
    return f"{n:,}".replace(",", " ")


ASSUMPTIONS = [
    "a lookup costs fixed + per-row work + its rows at the rate of the ceiling that binds its path (the runs' "
    "random-row ceiling of pinned or device memory at that table and row size, interpolated over table sizes; "
    "the host-gather ceiling and h2d for host paths) times a fitted efficiency; a row moves at least "
    "max(row_bytes, 64 B): every row shape is predicted from its rows and bytes",
    "an ETP group of n (tp 1) reads the same expected rows per rank from a shard of table/n, plus an "
    "all-reduce of n x rows x row_bytes (alpha-beta, fitted on the runs' ETP lookups)",
    "across nodes the inter-node link bounds the all-reduce's bus bandwidth and adds 2 (nodes - 1) link "
    "latencies",
    "host cores scale only the host-gather paths' gather term (thread fit where gather_threads was varied, "
    "else linearly)",
    "another machine scales each rate term by the measured figure over the given one: pinned kernels by h2d "
    "(and by the SM count where fewer SMs are given), resident kernels by the HBM read rate, host gathers by "
    "the host-gather rate, host copies by h2d; the compute is the asked one on every machine",
    "no lookup below its physical floor (rows x row_bytes over the fastest measured ceiling that binds it: "
    "host gather / h2d for host paths, d2d for resident tables) nor below the smallest lookup its path measured "
    "at fewer or equal rows and bytes; no step below its compute; every per-row and per-compute slope >= 0",
    "'vs HBM' is against the resident row a server would run instead: ids on the device, the option's timer "
    "and id distribution, the fastest graph mode (never a row of another timer)",
    "one compute kind: a path is fitted, and its compute pooled, only over steps of the same compute (the "
    "matmul chain, whose length is fitted; or one decoder configuration, whose measured time is its own)",
]


def model_advice(model: Model, *, table_bytes: int, row_bytes: int, heads: int, tokens: Sequence[int],
                 compute_us: float, w: WhatIf, hbm_bytes: int | None, host_bytes: int | None,
                 graph_modes: str = "replayed", compute_words: str | None = None,
                 ids: str | None = None) -> ModelAdvice:
    kw = dict(heads=heads, table_bytes=table_bytes, w=w, hbm_bytes=hbm_bytes, host_bytes=host_bytes,
              row_bytes=row_bytes, graph_modes=graph_modes, ids=ids)
    answers = []
    for t in tokens:
        opts = options_at(model, tokens=t, compute_us=compute_us, **kw)
        choice, rec = _choose(opts, table_bytes / GIB)
        answers.append(ModelTokenAnswer(t, opts, rec, choice))
    host = [a.tokens for a in answers if a.choice == "pinned host"]
    hbm = [a.tokens for a in answers if a.choice == "HBM"]
    any_pred = any(o.source == "predicted" for a in answers for o in a.options[:3])
    tag = " (predicted where marked)" if any_pred else " (measured)"
    if host and not hbm:
        verdict = f"Keep the table in pinned host memory at {', '.join(map(str, host))} tokens per step{tag}."
    elif hbm and not host:
        verdict = f"Keep the table in HBM at {', '.join(map(str, hbm))} tokens per step{tag}."
    elif host and hbm:
        verdict = (f"Pinned host memory at {', '.join(map(str, host))} tokens per step, HBM at "
                   f"{', '.join(map(str, hbm))}{tag}.")
    else:
        verdict = "No path fits the budgets."
    if w.etp > 1:
        verdict = f"ETP {w.etp}" + (f" over {w.nodes} nodes" if w.nodes > 1 else "") + ": " + verdict

    target = w.machine or model.rates.machine
    return ModelAdvice(what_if={k: v for k, v in asdict(w).items() if k != "machine"}, answers=answers, verdict=verdict,
                       what_would_change=what_would_change(model, tokens, compute_us, kw, compute_words),
                       loo_overall=asdict(model.loo_overall), rates=model.summary()["rates"],
                       assumptions=ASSUMPTIONS, extrap_overall=asdict(model.extrap_overall),
                       shape_overall=asdict(model.shape_overall), machine=target.to_json(),
                       machine_lines=machine_words(model.rates.machine, w.machine))


def machine_words(measured: Machine, target: Machine | None) -> list[str]:
    """The machine the prediction is for, each figure measured (its source) or given."""
    m = target or measured
    head = ("machine: another than the runs measured (the model's rate terms scaled by it)"
            if measured.differs(target) else "machine: the one the runs measured")
    return [head] + [f"  {line}" for line in m.lines()]
