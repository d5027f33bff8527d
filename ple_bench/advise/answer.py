"""``python -m ple_bench advise``: where should the PLE table live, and how should it be looked
up, for this shape -- answered from measured runs, the answer first.

Inputs: the table (``--table-bytes`` or ``--rows``), ``--dim``, ``--dtype``, ``--heads``, the
tokens per step (``--tokens 64,256,512``), the compute between the lookup's start and its use
(``--compute-us``), the memory the table may take (``--hbm-bytes``, ``--host-bytes``) and the run
folders to read (``--runs``).  From the decode-step records of those runs with the same row shape
(dim, dtype, heads), at the measured table size nearest to the asked one, the measured compute
length nearest to the asked one, and for each asked token count the nearest measured one, it ranks
every measured configuration -- the HBM-resident table, and the pinned host table with each lookup
path, prefetch on / off, ids on the host / the device, eager or breakable graph -- by step time,
with its overhead over the like-for-like resident step (``offload_overhead``, as recorded), and
recommends the fastest that fits the memory budgets.

Every number of that ranking is **measured** (it names the run and the measured table size, compute
and token count it comes from): where the asked shape was not measured it says how far the nearest
measurement is.  Beside it the what-if model (:mod:`ple_bench.advise.what_if`, :mod:`.model`) ranks
every path at exactly the asked shape, table, ETP group, host cores and machine (``--machine FILE``
and the machine flags, :mod:`.machine`), each number marked measured or predicted; a row shape no
run measured is answered by the model alone (every row predicted, with its held-out-shape error),
never refused.  ``--json`` prints the same as one JSON object.  Impossible inputs (no token count,
a table larger than every budget, no run) exit 2 with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .compute_kind import EXAMPLES as COMPUTE_EXAMPLES
from .compute_kind import ComputeAsk, parse_compute, records_of_compute
from ..env import gpu_available
from ..record import resident_figures
from ..report.verdict import (AS_FAST, EQUAL_PCT, FASTER, FUNCTIONAL_TEXT, NO_VERDICT, Entry, candidates, interval_of,
                              compute_of, is_functional, newest_verdicts, scope)
from ..units import DTYPE_BYTES, BadValue, parse_size
from .gpus import GpuError, get_gpu, gpu_names
from .html import write_advice_html
from .machine import Machine, MachineError, read_machine_file
from .model import build_model, load_runs
from .serving import ServingAdviseError, ServingAsk, advise_serving, format_serving_text
from ..serving.models import KV_DTYPES, MODELS, get_model
from .what_if import WhatIf, model_advice

EXIT_BAD_USAGE = 2


class AdviseError(ValueError):
    """Inputs that cannot be answered (exit 2)."""


@dataclass
class Option:
    placement: str  # "HBM" | "HBM, ids copied" (in the step: never a baseline) | "pinned host"
    path: str
    prefetch: bool
    ids_on: str
    graph: str
    step_ms: float
    overhead_pct: float | None  # step_ms / baseline_ms - 1, in % (pinned rows)
    fits: bool
    case_id: str
    run_id: str
    timer: str = ""
    ids: str = "uniform"
    baseline_ms: float | None = None  # the HBM row it is held against (listed among the options)
    baseline_case_id: str = ""
    ci_low: float | None = None  # the 95 % interval of step_ms / baseline_ms (report/verdict.py)
    ci_high: float | None = None


@dataclass
class TokenAnswer:
    tokens: int
    measured_tokens: int
    options: list[Option] = field(default_factory=list)
    recommendation: str = ""
    verdict: str = NO_VERDICT  # the measured verdict at this token count (report/verdict.py)
    verdict_case_id: str = ""  # the pinned step the verdict rests on, and its run
    verdict_run_id: str = ""


@dataclass
class Advice:
    table_bytes: int
    measured_table_bytes: int
    compute_us: float
    measured_compute_us: float
    answers: list[TokenAnswer]
    verdict: str
    notes: list[str]
    measured_verdict: str = ""  # the verdict from the nearest measurements alone
    model: Any = None  # what_if.ModelAdvice: the model's ranking at exactly the asked shape
    ids: str = ""  # the id distribution (traffic) every number below is of
    compute: str = ""  # the asked compute (compute_kind.ComputeAsk.spec; "" when asked as compute_us only)
    compute_label: str = ""  # the asked compute, in words
    measured_compute_label: str = ""  # the compute the numbers were measured with, in words
    holds_for: str = ""  # the traffic and compute the answer holds for, in words (printed first)
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # verdict.json's entries for this shape

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _present(v: Any) -> bool:
    """A stored value (records loaded through pandas hold NaN where a field is missing)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def _path_name(rec: dict[str, Any]) -> str:
    impl = str(rec.get("impl"))
    kernel = rec.get("kernel") if _present(rec.get("kernel")) else ""
    name = impl if not kernel else f"{impl} · {kernel}"
    if _present(rec.get("sm_limit")) and rec.get("sm_limit"):
        name += f" · {int(rec['sm_limit'])} SMs"
    if _present(rec.get("cache_rows")) and rec.get("cache_rows"):
        name += f" · cache {int(rec['cache_rows'])} rows"
    extra = rec.get("extra")
    if isinstance(extra, dict) and extra:
        name += "".join(f" · {k}={v}" for k, v in sorted(extra.items()))
    return name


def _nearest(values, want: float, log: bool = False):
    def dist(v):
        return abs(math.log(v / want)) if log and v > 0 and want > 0 else abs(v - want)
    return min(values, key=dist) if values else None


def _ids_on(r: dict[str, Any]) -> str:
    return str(r["ids_on"]) if _present(r.get("ids_on")) else "device"


def _option(r: dict[str, Any], fits_hbm: bool, fits_host: bool,
            every: dict[tuple[str, str], dict[str, Any]] | None = None) -> Option:
    """A pinned step, held against the resident figure its record names (with the ratio's
    interval where both records hold samples)."""
    base = float(r["offload_baseline_ms"])
    lo, hi = interval_of(r, (every or {}).get((str(r.get("_run_id")), str(r.get("offload_baseline")))))
    return Option(placement="pinned host", path=_path_name(r), prefetch=bool(r.get("prefetch")), ids_on=_ids_on(r),
                  graph=str(r["graph"]) if _present(r.get("graph")) else "eager", step_ms=float(r["step_ms"]),
                  overhead_pct=100.0 * (float(r["step_ms"]) / base - 1.0), fits=fits_host,
                  case_id=str(r.get("case_id")), run_id=r["_run_id"], timer=str(r.get("timer")),
                  ids=str(r.get("ids") or "uniform"), baseline_ms=base,
                  baseline_case_id=str(r.get("offload_baseline")), ci_low=lo, ci_high=hi)


def _resident_options(rows: list[dict[str, Any]], pinned: list[Option], fits_hbm: bool,
                      every: dict[tuple[str, str], dict[str, Any]]) -> list[Option]:
    """The HBM rows: each resident figure a pinned option is held against (its case, graph mode
    and timer, from the option's own run: ``every`` maps (run, case_id) to records), then the
    resident steps with ids copied in the step (never a baseline)."""
    out: list[Option] = []
    seen = set()
    for o in pinned:
        r = every.get((o.run_id, o.baseline_case_id))
        if r is None:
            continue
        for f in resident_figures(r):
            key = (o.run_id, f.case_id, f.graph, f.timer)
            if f.timer == o.timer and f.ms == o.baseline_ms and key not in seen:
                seen.add(key)
                out.append(Option(placement="HBM", path=_path_name(r), prefetch=bool(r.get("prefetch")), ids_on="device",
                                  graph=f.graph, step_ms=f.ms, overhead_pct=None, fits=fits_hbm, case_id=f.case_id,
                                  run_id=r["_run_id"], timer=f.timer, ids=str(r.get("ids") or "uniform")))
    for r in rows:
        if r.get("impl") == "device" and _ids_on(r) == "host":
            out.append(Option(placement="HBM, ids copied", path=_path_name(r),
                              prefetch=bool(r.get("prefetch")), ids_on="host",
                              graph=str(r.get("graph") or "eager"), step_ms=float(r["step_ms"]), overhead_pct=None,
                              fits=fits_hbm, case_id=str(r.get("case_id")), run_id=r["_run_id"],
                              timer=str(r.get("timer")), ids=str(r.get("ids") or "uniform")))
    return out


def advise(*, table_bytes: int, dim: int, dtype: str, heads: int, tokens: list[int], compute_us: float,
           records: list[dict[str, Any]], hbm_bytes: int | None = None, host_bytes: int | None = None,
           graph_modes: str = "any", ids: str | None = None) -> Advice:
    """The ranked options and the recommendation, from measured step records, by the rule of
    :mod:`ple_bench.report.verdict`.  ``graph_modes``: ``any`` (default) ranks every stable pinned
    step by its step time, ``replayed`` only graph-replayed ones where the runs have them;
    ``ids``: the id distribution (default: the one with the most stable pinned steps)."""
    if not tokens or any(t < 1 for t in tokens):
        raise AdviseError(f"--tokens: give one or more positive token counts per step, got {tokens}")
    if table_bytes < 1:
        raise AdviseError("--table-bytes / --rows: the table must have at least one row")
    if dtype not in DTYPE_BYTES:
        raise AdviseError(f"--dtype: unknown {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    fits_hbm = hbm_bytes is None or table_bytes <= hbm_bytes
    fits_host = host_bytes is None or table_bytes <= host_bytes
    if not fits_hbm and not fits_host:
        raise AdviseError(f"the table ({table_bytes / 2**30:.1f} GiB) fits neither the HBM budget "
                          f"({hbm_bytes / 2**30:.1f} GiB) nor the host budget ({host_bytes / 2**30:.1f} GiB)")
    same_shape = [r for r in records if (int(r.get("dim") or 0), str(r.get("dtype")), int(r.get("num_heads") or 0))
                  == (dim, dtype, heads) and r.get("step_ms")]
    if not same_shape:  # nothing measured at this row shape: the model answers (predicted, marked)
        return Advice(table_bytes, 0, compute_us, compute_us,
                      [TokenAnswer(tokens=t, measured_tokens=0, recommendation="not measured at this row shape: "
                                   "the model's rows (predicted) answer") for t in tokens],
                      "No verdict from measurements: no decode step of this row shape was measured.",
                      [f"no measured decode step of dim {dim}, {dtype}, {heads} heads in the runs given: every "
                       "number is predicted by the model from the rows and bytes this shape moves, with its "
                       "held-out-shape error beside it (measure it: python -m ple_bench run --suite paths)"],
                      ids=ids or "uniform")
    notes: list[str] = []
    every = {(str(r.get("_run_id")), str(r.get("case_id"))): r for r in same_shape}  # baselines are per run
    # the one verdict (report/verdict.py), each run judged on its own records, the newest per key
    entries = newest_verdicts(same_shape)
    # the newest measurement of each case (run ids sort by date): earlier runs' figures may carry errata
    newest: dict[str, dict[str, Any]] = {}
    for r in sorted(same_shape, key=lambda r: r["_run_id"]):
        newest[str(r.get("case_id"))] = r
    same_shape = list(newest.values())
    # the rule of report/verdict.py: stable pinned steps with a resident baseline, one table size
    # (the nearest measured), one compute (the nearest), one id distribution

    cands = candidates(same_shape)
    sizes = {int(r["table_bytes"]) for r in cands if r.get("table_bytes")} or \
        {int(r["table_bytes"]) for r in same_shape if r.get("table_bytes")}
    measured_table = _nearest(sorted(sizes), table_bytes, log=True)
    pool = [r for r in same_shape if int(r.get("table_bytes") or 0) == measured_table]
    cands = [r for r in cands if int(r.get("table_bytes") or 0) == measured_table]
    computes = {float(r.get("compute_us") or 0) for r in cands} or {float(r.get("compute_us") or 0) for r in pool}
    measured_compute = _nearest(sorted(computes), compute_us)
    pool = [r for r in pool if float(r.get("compute_us") or 0) == measured_compute]
    cands = [r for r in cands if float(r.get("compute_us") or 0) == measured_compute]
    where = scope(cands, table_bytes=measured_table, ids=ids)
    chosen_ids = where.ids if where else (ids or "uniform")
    pool = [r for r in pool if str(r.get("ids") or "uniform") == chosen_ids]
    cands = [r for r in cands if str(r.get("ids") or "uniform") == chosen_ids]
    notes.append(f"{chosen_ids} ids (the distribution with the most stable pinned steps here"
                 + (", as asked)" if ids else "; --ids picks another)"))
    if abs(math.log(measured_table / table_bytes)) > math.log(1.1):
        notes.append(f"measured on a {measured_table / 2**30:.1f} GiB table, not the asked "
                     f"{table_bytes / 2**30:.1f} GiB: the pinned row rate falls with table size "
                     "(docs/host-allocation.md), so a larger table costs pinned paths more")
    if measured_compute != compute_us:
        notes.append(f"measured with {measured_compute:g} us of compute, not the asked {compute_us:g} us")
    answers = []
    shape: list[Entry] = []
    for t in tokens:
        counts = sorted({int(r["num_tokens"]) for r in (cands or pool)})
        measured_t = _nearest(counts, t)
        rows = [r for r in pool if int(r["num_tokens"]) == measured_t]
        steps = [r for r in cands if int(r["num_tokens"]) == measured_t]
        replayed = [r for r in steps if r.get("graph", "eager") != "eager"]
        if replayed and graph_modes == "replayed":
            steps = replayed
        # one ranking per timer (a ratio is only against the HBM row on its own timer), by ratio
        pinned = sorted((_option(r, fits_hbm, fits_host, every) for r in steps),
                        key=lambda o: (not o.fits, o.timer, o.overhead_pct))
        options = _resident_options(rows, pinned, fits_hbm, every) + pinned
        ans = TokenAnswer(tokens=t, measured_tokens=measured_t, options=options)
        computes_here = {compute_of(r) for r in (steps or rows)}  # decoder steps: (decoder, shape, layers, ctx)
        entry = next((e for e in entries if (e.table_bytes, e.ids, e.num_tokens)
                      == (measured_table, chosen_ids, measured_t) and e.compute in computes_here), None)
        if graph_modes == "replayed" and entry is not None and entry.pinned is not None \
                and entry.pinned.get("graph", "eager") == "eager" and replayed:
            entry = None  # the verdict's step is eager: the ranking of replayed steps answers instead
        ans.verdict = entry.verdict if entry is not None else NO_VERDICT
        if entry is not None and entry.pinned is not None:
            ans.verdict_case_id, ans.verdict_run_id = str(entry.pinned_case_id), str(entry.pinned.get("_run_id"))
        if entry is not None:
            shape.append(entry)
        best = _best(ans)
        if best is None:
            why = entry.reason if entry is not None and entry.reason else \
                "no stable pinned step with a resident baseline was measured at this shape"
            ans.recommendation = ("HBM" if fits_hbm else "no measured pinned option fits") + f": {why}"
        else:
            ci = (f" (95 % CI {best.ci_low:.3f}-{best.ci_high:.3f})" if best.ci_low is not None else "")
            vs = f"{best.step_ms:.4f} ms vs HBM {best.baseline_ms:.4f} ms ({best.timer}), ratio {best.step_ms / best.baseline_ms:.3f}{ci}"
            what = f"{best.path}, ids on the {best.ids_on}, {best.graph}, prefetch {'on' if best.prefetch else 'off'}"
            word = entry.verdict if entry is not None else ("as fast" if best.overhead_pct <= EQUAL_PCT else "slower")
            if not fits_hbm:
                ans.recommendation = f"pinned host (the table does not fit the HBM budget): {what}: {vs}"
            elif word in (FASTER, AS_FAST):
                ans.recommendation = (f"pinned host, {word}: {what}: {vs} -- frees the table's "
                                      f"{table_bytes / 2**30:.1f} GiB of HBM")
            else:
                ans.recommendation = f"HBM: the best pinned step ({what}) is {word}: {vs}"
        if measured_t != t:
            ans.recommendation += f" (measured at {measured_t} tokens)"
        answers.append(ans)
    verdict = _verdict(answers, fits_hbm)
    unique = list({id(e): e for e in shape}.values())
    return Advice(table_bytes, measured_table, compute_us, measured_compute, answers, verdict, notes, ids=chosen_ids,
                  verdicts=[e.to_json() for e in unique])


def _flip(answers: list[TokenAnswer]) -> str:
    """Where the answer flips, in a clause: the best pinned step's ratio crossing the band's edge
    between two token counts."""
    host = {FASTER, AS_FAST}
    for a, b in zip(answers, answers[1:]):
        if (a.verdict in host) == (b.verdict in host) or NO_VERDICT in (a.verdict, b.verdict):
            continue
        ra, rb = _best_ratio(a), _best_ratio(b)
        if ra is None or rb is None:
            continue
        edge = 1 + EQUAL_PCT / 100
        up = b.verdict not in host
        return (f" From {b.tokens} tokens {'HBM' if up else 'pinned host memory'} wins: the best pinned step's time "
                f"over HBM's {'rises' if up else 'falls'} from {ra:.3f} at {a.tokens} tokens "
                f"{'past' if up else 'under'} {edge:.2f} (HBM + {EQUAL_PCT:.0f} %) to {rb:.3f} at {b.tokens} "
                f"({'its lookup stops hiding behind the compute' if up else 'the compute hides its lookup again'}).")
    return ""


def _best(a: TokenAnswer) -> Option | None:
    """The pinned row the verdict rests on (report/verdict.py), else (no verdict there, or it
    does not fit its budget) the fitting row with the lowest ratio."""
    rows = [o for o in a.options if o.placement == "pinned host" and o.baseline_ms]
    named = next((o for o in rows if (o.case_id, o.run_id) == (a.verdict_case_id, a.verdict_run_id) and o.fits), None)
    fitting = [o for o in rows if o.fits]
    return named or (min(fitting, key=lambda o: o.step_ms / o.baseline_ms) if fitting else None)


def _best_ratio(a: TokenAnswer) -> float | None:
    best = _best(a)
    return best.step_ms / best.baseline_ms if best is not None else None


def _verdict(answers: list[TokenAnswer], fits_hbm: bool) -> str:
    """The measured headline, from each token count's verdict (report/verdict.py)."""
    host = [a.tokens for a in answers if a.verdict in (FASTER, AS_FAST)]
    hbm = [a.tokens for a in answers if a.verdict not in (FASTER, AS_FAST, NO_VERDICT)]
    none = [a.tokens for a in answers if a.verdict == NO_VERDICT]
    def said(a: TokenAnswer) -> str:
        b = _best(a)
        if b is None or a.verdict == NO_VERDICT:
            return f"{a.tokens} tokens {a.verdict}"
        ci = f", 95 % CI {b.ci_low:.3f}-{b.ci_high:.3f}" if b.ci_low is not None else ""
        return f"{a.tokens} tokens {a.verdict} ({b.step_ms / b.baseline_ms:.3f}{ci})"
    words = "; ".join(said(a) for a in answers)
    tail = f" Measured, per token count (pinned / HBM): {words}."
    if not fits_hbm:
        return "The table does not fit the HBM budget: pinned host memory, with the path ranked first below." + tail
    if none and not host and not hbm:
        return "No verdict: no stable pinned step with a resident baseline was measured at the asked shape." + tail
    if host and not hbm:
        return (f"Keep the table in pinned host memory: as fast as HBM (interval within {EQUAL_PCT:.0f} %) or "
                f"faster at {', '.join(map(str, host))} tokens." + tail)
    if hbm and not host:
        return (f"Keep the table in HBM: no measured pinned path is within {EQUAL_PCT:.0f} % of it at "
                f"{', '.join(map(str, hbm))} tokens." + tail)
    return (f"Pinned host memory at {', '.join(map(str, host))} tokens, HBM at {', '.join(map(str, hbm))}."
            + _flip(answers) + tail)


def _pct_err(st: dict[str, Any], what: str) -> str:
    return (f"{what}: median {st['median_pct']:.0f} %, worst {st['worst_pct']:.0f} % ({st['n']} steps)"
            if st.get("n") else f"{what}: not measured")


def format_model_text(m: Any) -> list[str]:
    lines = [m.verdict, "",
             "the model's ranking at exactly the asked shape: 'measured' = that case was measured (run named), "
             "'predicted' = the what-if model, with its path's held-out-shape (shape; where not measured: "
             "leave-one-out, LOO) and extrapolation (ext) errors (median/worst); 'unchecked' = neither error of "
             "its path was measured: listed, never recommended; "
             "'extrapolated' = past the path's measured rows; 'floor' = a floor raised it; 'vs HBM' = against the "
             "resident row named in 'HBM #' (ids on the device, the same timer and id distribution, its best graph "
             "mode)",
             _pct_err(m.shape_overall or {}, "model error on held-out shapes (every step of one table size x row "
                      "bytes x heads left out, everything refitted on the other shapes)"),
             _pct_err(m.loo_overall, "model error, leave-one-out by configuration group (every token count of one "
                      "path at one table and compute left out together)"),
             _pct_err(m.extrap_overall or {}, "model error extrapolating (each path's largest token count held "
                      "out)")]
    lines += list(m.machine_lines)
    w = m.what_if
    if w["etp"] > 1 or w["host_cores"]:
        lines.append(f"what-if: ETP {w['etp']}, {w['nodes']} node(s), link {w['link_gbps'] or '-'} GB/s / "
                     f"{w['link_latency_us']:g} us, host cores {w['host_cores'] or 'as measured'}")
    for ans in m.answers:
        lines += ["", f"{ans.tokens} tokens per step: {ans.recommendation}",
                  f"  {'#':>2} {'placement':<11} {'path':<34} {'pf':<3} {'ids':<6} {'dist':<7} {'alloc':<5} "
                  f"{'timer':<10} {'graph':<9} {'step ms':>8} {'vs HBM':>8} {'HBM #':>5} {'HBM ms':>8}  source"]
        index = {o.path_id: i for i, o in enumerate(ans.options, 1)}
        notes: dict[str, list[str]] = {}
        for i, o in enumerate(ans.options, 1):
            over = "" if o.overhead_pct is None else f"{o.overhead_pct:+.0f} %"
            base = f"#{index[o.baseline]}" if o.baseline in index else ""
            base_ms = "" if o.baseline_step_ms is None else f"{o.baseline_step_ms:.3f}"
            if o.placement != "HBM" and o.baseline_note:
                notes.setdefault(o.baseline_note, []).append(f"#{i}")
            if o.source == "measured":
                src = f"measured {o.run_id}"
            elif not o.checked:
                src = "predicted, unchecked"
            else:
                def pct(what, med, worst, own):
                    return f"{what} {med:.0f}/{worst:.0f} %" if own and med is not None else f"{what} n/a"
                what = "shape" if "shape" in o.error else "LOO"
                src = (f"predicted ({pct(what, o.error_median_pct, o.error_worst_pct, 'all paths' not in o.error)}, "
                       f"{pct('ext', o.extrap_median_pct, o.extrap_worst_pct, 'all paths' not in o.extrap_error)})")
            if o.source != "measured":
                src += " extrapolated" if o.extrapolated else ""
                src += " floor" if o.floors else ""
            fits = "" if o.fits else "  (does not fit its budget)"
            lines.append(f"  {i:>2} {o.placement[:11]:<11} {o.path[:34]:<34} {'on' if o.prefetch else 'off':<3} "
                         f"{o.ids_on:<6} {o.ids[:7]:<7} {o.host_alloc[:5]:<5} {o.timer[:10]:<10} {o.graph:<9} "
                         f"{o.step_ms:8.3f} {over:>8} {base:>5} {base_ms:>8}  {src}{fits}")
        lines += [f"  note {', '.join(rows)}: {n}" for n, rows in notes.items()]
    lines += ["", "what would change it:"] + [f"  - {t}" for t in m.what_would_change]
    lines += ["", "assumptions of the model:"] + [f"  - {t}" for t in m.assumptions]
    return lines


def format_model_short(m: Any) -> list[str]:
    """The model's answer in short (a shape nothing measured): its errors, the machine, and per token
    count the best row of each placement, each predicted with its path's held-out-shape error."""
    lines = _wrap(_pct_err(m.shape_overall or {}, "model error on held-out shapes")
                  + "; " + _pct_err(m.extrap_overall or {}, "extrapolating"))
    lines += list(m.machine_lines)
    for ans in m.answers:
        lines += [""] + _wrap(f"{ans.tokens} tokens per step: {ans.recommendation}")
        lines.append(f"    {'placement':<11} {'path':<30} {'ids on':<6} {'graph':<9} {'timer':<10} "
                     f"{'step ms':>8} {'vs HBM':>7}  source (held-out-shape error median/worst)")
        seen: set[tuple[str, str]] = set()
        for o in ans.options:
            if (o.placement, o.timer) in seen or not o.fits:
                continue
            seen.add((o.placement, o.timer))
            over = "" if o.overhead_pct is None else f"{o.overhead_pct:+.0f} %"
            src = "measured" if o.source == "measured" else (
                f"predicted, {o.error_median_pct:.0f}/{o.error_worst_pct:.0f} %"
                if o.error_median_pct is not None else "predicted, error not measured")
            lines.append(f"    {o.placement[:11]:<11} {o.path[:30]:<30} {o.ids_on:<6} {o.graph:<9} {o.timer[:10]:<10} "
                         f"{o.step_ms:8.3f} {over:>7}  {src}"[:SHORT_WIDTH])
    return lines


def format_text(a: Advice) -> str:
    lines = [a.holds_for, ""] if a.holds_for else []
    lines += format_model_text(a.model) + ["", "--- nearest measurements (measured only) ---", ""] if a.model else []
    lines += [a.measured_verdict or a.verdict, ""]
    compute = (f"compute {a.compute_label} (measured {a.measured_compute_label})" if a.compute_label else
               f"compute {a.compute_us:g} us (measured {a.measured_compute_us:g} us)")
    lines.append(f"table {a.table_bytes / 2**30:.1f} GiB (measured {a.measured_table_bytes / 2**30:.1f} GiB), "
                 f"{compute}; every number below is measured (run and case named), none predicted")
    for n in a.notes:
        lines.append(f"note: {n}")
    for ans in a.answers:
        lines += ["", f"{ans.tokens} tokens per step (measured at {ans.measured_tokens}): {ans.recommendation}",
                  "  the HBM rows the pinned steps are held against (ids on the device, best graph mode, each "
                  "pinned step's timer), then the pinned steps by step time; vs HBM = step ms / HBM ms - 1",
                  "  ('HBM, ids copied': the resident step that copies its ids to the GPU inside the step -- "
                  "listed, never the baseline)",
                  f"  {'#':>2} {'placement':<15} {'path':<30} {'pf':<3} {'ids on':<6} {'ids':<9} {'graph':<9} "
                  f"{'timer':<10} {'step ms':>8} {'HBM ms':>8} {'vs HBM':>8}  run"]
        for i, o in enumerate(ans.options, 1):
            over = "" if o.overhead_pct is None else f"{o.overhead_pct:+.1f} %"
            base = "" if o.baseline_ms is None else f"{o.baseline_ms:.4f}"
            fits = "" if o.fits else "  (does not fit its budget)"
            lines.append(f"  {i:>2} {o.placement[:15]:<15} {o.path[:30]:<30} {'on' if o.prefetch else 'off':<3} "
                         f"{o.ids_on:<6} {o.ids[:9]:<9} {o.graph:<9} {o.timer[:10]:<10} {o.step_ms:8.4f} {base:>8} "
                         f"{over:>8}  {o.run_id}{fits}")
    return "\n".join(lines)


#: the short answer's width (its tables and wrapped sentences)
SHORT_WIDTH = 120


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, SHORT_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [""]


def _ratio_text(o: Option) -> str:
    if not o.baseline_ms:
        return ""
    r = o.step_ms / o.baseline_ms
    return f"{r:.3f} ({o.ci_low:.3f}-{o.ci_high:.3f})" if o.ci_low is not None else f"{r:.3f} (no samples)"


def format_short(a: Advice) -> str:
    """The answer in at most :data:`SHORT_WIDTH` columns: the headline (measured where measured),
    then per token count one ranking per timer -- the HBM row and the best row of each pinned path,
    each ratio with its 95 % interval (``--all``: every row, :func:`format_text`)."""
    lines: list[str] = []
    if a.holds_for:
        lines += _wrap(a.holds_for) + [""]
    lines += _wrap(a.verdict)
    if not a.measured_table_bytes and a.model is not None:  # nothing measured at this row shape
        for n in a.notes:
            lines += _wrap(f"note: {n}")
        return "\n".join(lines + [""] + format_model_short(a.model))
    if a.model is not None and a.model.verdict != a.verdict and any(x.verdict == NO_VERDICT for x in a.answers):
        lines += _wrap("The what-if model (predicted; --all prints its rows and errors): " + a.model.verdict)
    compute = (f"compute {a.compute_label} (measured {a.measured_compute_label})" if a.compute_label else
               f"compute {a.compute_us:g} us (measured {a.measured_compute_us:g} us)")
    lines += [""] + _wrap(f"table {a.table_bytes / 2**30:.1f} GiB (measured {a.measured_table_bytes / 2**30:.1f} GiB), "
                          f"{compute}; every row below is measured; pinned / HBM: the step's ratio to the HBM row of "
                          "its timer, with its 95 % bootstrap interval; --all prints every row")
    for n in a.notes:
        lines += _wrap(f"note: {n}")
    for ans in a.answers:
        lines += [""] + _wrap(f"{ans.tokens} tokens per step (measured at {ans.measured_tokens}): {ans.recommendation}")
        pinned = [o for o in ans.options if o.placement == "pinned host"]
        best = _best(ans)
        rankings = sorted({(o.timer, o.run_id) for o in pinned},
                          key=lambda k: (best is None or k != (best.timer, best.run_id),
                                         min(o.overhead_pct for o in pinned if (o.timer, o.run_id) == k)))
        for timer, run_id in rankings:
            mine = sorted((o for o in pinned if (o.timer, o.run_id) == (timer, run_id)), key=lambda o: o.overhead_pct)
            hbm = [o for o in ans.options if o.placement == "HBM" and (o.timer, o.run_id) == (timer, run_id)
                   and o.step_ms == mine[0].baseline_ms]
            by_path: dict[str, Option] = {}
            for o in mine:
                by_path.setdefault(o.path, o)
            rows = hbm[:1] + list(by_path.values())
            lines += _wrap(f"ranked on the {timer} timer, run {run_id}:", "  ")
            lines.append(f"    {'placement':<11} {'path':<36} {'ids on':<6} {'graph':<9} "
                         f"{'step ms':>8} {'HBM ms':>8}  pinned / HBM (95 % CI)")
            for o in rows:
                base = "" if o.baseline_ms is None else f"{o.baseline_ms:.4f}"
                fits = " (over budget)" if not o.fits else ""
                lines.append(f"    {o.placement[:11]:<11} {o.path[:30]:<30} {o.ids_on:<6} {o.graph:<9} "
                             f"{o.step_ms:8.4f} {base:>8}  {_ratio_text(o)}{fits}".rstrip()[:SHORT_WIDTH])
    return "\n".join(lines)


def add_advise_args(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--table-bytes", help="table size, e.g. 47.7GiB or 51200286720 (required without --model)")
    size.add_argument("--rows", type=int, help="table rows (vocabulary)")
    p.add_argument("--dim", type=int, help="elements per row (required without --model)")
    p.add_argument("--dtype", help="fp32 | fp16 | bf16 | fp8 (required without --model)")
    p.add_argument("--heads", type=int, help="rows per token (required without --model)")
    p.add_argument("--tokens", help="tokens per step, comma-separated (e.g. 64,256,512); required without --model")
    p.add_argument("--compute-us", type=float,
                   help="a matmul chain of this many microseconds between the lookup's start and its use "
                        "(the same as --compute us:N)")
    p.add_argument("--compute", metavar="KIND",
                   help="the compute between the lookup's start and its use: us:<microseconds> (the matmul "
                        "chain) or decoder:[<shape>:]<layers>x<context> (decoder layers over a KV cache of that "
                        "many tokens per sequence, shape default qwen3-8b); the model calibrates on that kind only")
    p.add_argument("--hbm-bytes", help="HBM the table may take (default: no limit); with --model: the GPU's HBM "
                                       "(default: the GPU the runs measured), e.g. 80GB")
    p.add_argument("--host-bytes", help="host memory the table may take (default: no limit)")
    p.add_argument("--runs", nargs="+", metavar="RUN_DIR",
                   help="run folders to read (docs/runs/*); without it, advise runs the few cases it needs")
    p.add_argument("--etp", type=int, default=1, help="what-if: an ETP group of N GPUs shares the table (tp 1)")
    p.add_argument("--nodes", type=int, default=1, help="what-if: the ETP group spans this many nodes")
    p.add_argument("--link-gbps", type=float, help="what-if: inter-node bandwidth per GPU, GB/s")
    p.add_argument("--link-latency-us", type=float, default=0.0, help="what-if: inter-node latency, us")
    p.add_argument("--host-cores", type=int, help="what-if: host cores for the host-gather paths")
    mach = p.add_argument_group("machine (what-if: another machine; default the one the runs measured)")
    mach.add_argument("--machine", metavar="FILE",
                      help="a machine description, TOML or JSON (.json), keys: " + ", ".join(Machine.KEYS)
                           + " (a [machine] table or top-level keys); the flags below override it")
    mach.add_argument("--h2d-gbps", type=float, help="host-to-device GB/s (e.g. 375 for a Grace Hopper's C2C)")
    mach.add_argument("--hbm-gbps", type=float, help="HBM read GB/s")
    mach.add_argument("--host-gather-rows-per-s", type=float, help="the host gather's row rate, rows/s")
    mach.add_argument("--sms", type=int, help="SMs the lookup kernels may use")
    mach.add_argument("--gpu-hbm-bytes", help="the GPU's HBM (the machine's; --hbm-bytes is the table's budget)")
    mach.add_argument("--gpu", metavar="NAME",
                      help="with --model: answer for this GPU (its memory as the card reports it, its datasheet "
                           "figures, each with its source; ple_bench/advise/gpus.toml): " + ", ".join(gpu_names()))
    p.add_argument("--html", metavar="PATH", help="also write the answer as an HTML page")
    p.add_argument("--results-dir", default="results", help="where a self-run (no --runs) stores its run")
    p.add_argument("--measure", choices=["few", "all"], default="few",
                   help="without --runs: measure only the cases no model settles (few: the posted host gather and "
                        "the UVA kernel with their resident steps, about a minute on one H200) or every path (all)")
    p.add_argument("--functional-check", action="store_true",
                   help="without a GPU and without --runs: run advise's handful of cases in functional mode "
                        "(CPU) to check the code paths; ranks nothing (without it advise refuses there, exit 2)")
    p.add_argument("--graph", choices=["replayed", "any"], default="any",
                   help="rank every stable pinned step by its step time (default), or only graph-replayed ones "
                        "where the runs have them")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text (its 'verdicts': the "
                                                       "verdict.json entries of the asked shape)")
    p.add_argument("--all", action="store_true",
                   help="print every row (every measured step, the model's every prediction); default: per token "
                        "count the HBM row and the best row of each pinned path, one ranking per timer")
    serve = p.add_argument_group("serving (--model): tokens/s and TPOT per placement at the batch each holds")
    serve.add_argument("--model", help="a model preset (ple_bench.serving.models: e.g. qwen3-8b, qwen3-32b, tiny): "
                                       "answer what the placement buys in tokens/s and TPOT, from serve records "
                                       "where the runs have them, else predicted")
    serve.add_argument("--context", type=int, help="with --model: tokens of context per sequence (e.g. 8192)")
    serve.add_argument("--kv-dtype", default="bf16", help="with --model: the KV cache's dtype (bf16 | fp8)")
    serve.add_argument("--tpot-ms", type=float, help="with --model: the TPOT target, ms per output token "
                                                      "(default 30)")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                       help="with --model: the share of HBM the server may use (default 0.90, as serving engines)")
    p.add_argument("--ids", help="the traffic the answer is for: only records of this id workload "
                                 "(e.g. text:code, zipf:1.1, uniform; default: every workload in the runs)")


def wanted_ids(ids: str) -> str:
    """``--ids`` in its canonical spelling; AdviseError for a bad spec."""
    # the id workloads' parser lives with their generators (torch): loaded only for --ids
    from ..workload import parse_ids_spec

    try:
        return parse_ids_spec(ids).canonical
    except ValueError as exc:
        raise AdviseError(f"--ids: {exc}") from None


def records_for_ids(records: list[dict[str, Any]], ids: str | None) -> list[dict[str, Any]]:
    """The records of id workload ``ids`` (any spelling of it); all of them when ``ids`` is None.
    AdviseError for a bad spec, or when the runs hold no record of it (naming those they hold)."""
    if ids is None:
        return records
    want = wanted_ids(ids)
    from ..workload import parse_ids_spec  # (loaded only for --ids: see wanted_ids)

    def canonical(r):
        try:
            return parse_ids_spec(str(r.get("ids", "uniform"))).canonical
        except ValueError:
            return None
    kept = [r for r in records if canonical(r) == want]
    if not kept:
        have = sorted({c for c in map(canonical, records) if c})
        raise AdviseError(f"--ids: no record of ids {want!r} in the runs given (they hold: {', '.join(have) or 'none'})")
    return kept


def compute_asked(args: argparse.Namespace) -> ComputeAsk:
    """The compute asked (``--compute`` or ``--compute-us``: one of them, not both); sets
    ``args.compute_us`` to the chain's length (0 for decoder layers).  AdviseError naming the flag."""
    given = [f for f, v in (("--compute", args.compute), ("--compute-us", args.compute_us)) if v is not None]
    if not given:
        raise AdviseError(f"--compute: say what compute the lookup hides behind, e.g. {COMPUTE_EXAMPLES}")
    if len(given) == 2:
        raise AdviseError("--compute / --compute-us: give one of them (--compute-us N is --compute us:N)")
    if args.compute_us is not None:
        if args.compute_us < 0:
            raise AdviseError(f"--compute-us: must be >= 0, got {args.compute_us}")
        return ComputeAsk("matmul", compute_us=float(args.compute_us))
    try:
        ask = parse_compute(args.compute)
    except ValueError as exc:
        raise AdviseError(f"--compute: {exc}") from None
    args.compute_us = ask.compute_us
    return ask


def records_for_compute_ask(records: list[dict[str, Any]], ask: ComputeAsk) -> tuple[list, ComputeAsk, list[str]]:
    """:func:`ple_bench.advise.compute_kind.records_of_compute` over the step records, the other
    records (lookups: the model's machine rates) kept; AdviseError naming ``--compute``."""
    try:
        steps, measured, notes = records_of_compute(records, ask)
    except ValueError as exc:
        raise AdviseError(f"--compute: {exc}") from None
    return [r for r in records if r.get("kind") != "step"] + steps, measured, notes


def name_the_scope(advice: Advice, ask: ComputeAsk, measured: ComputeAsk, notes: list[str]) -> None:
    """Put the traffic and the compute the answer holds for into ``advice`` (and its notes)."""
    if ask.kind == "matmul":
        measured = ComputeAsk("matmul", compute_us=advice.measured_compute_us)
    advice.compute, advice.compute_label, advice.measured_compute_label = ask.spec, ask.label, measured.label
    advice.notes = notes + advice.notes
    asked = "" if measured == ask else f" (asked: {ask.label})"
    where = (f"measured on a {advice.measured_table_bytes / 2**30:.1f} GiB table" if advice.measured_table_bytes
             else "predicted: no step of this row shape was measured")
    advice.holds_for = f"holds for: {advice.ids} ids, {measured.label}{asked}, {where}"


def scoped_verdict(advice: Advice) -> None:
    """The verdicts (the answer's, the measured one's, the model's) closed by the traffic and the
    compute they hold for."""
    tail = f" Holds for {advice.ids} ids and {advice.measured_compute_label}."
    advice.verdict += tail
    if advice.measured_verdict:
        advice.measured_verdict += tail
    if advice.model is not None:
        advice.model.verdict += tail


def _size(name: str, value: Any) -> int:
    """``--name``'s size in bytes ("47.7GiB" rounds to whole bytes here: a suite wants them exact)."""
    try:
        return parse_size(str(value), exact=False)
    except BadValue as exc:
        raise AdviseError(f"--{name}: {exc} (e.g. 47.7GiB, 200GB, 51200286720)") from None


#: where advise --model reads runs when none are given (the repository's archive)
ARCHIVE = "docs/runs"
#: the serving suite's table (suites/serving.toml: Qwen4Exp's PLE shape), the default of advise --model
DEFAULT_SERVING_TABLE = {"rows": 320001536, "dim": 160, "dtype": "fp8", "heads": 16}


def _serving_table(args: argparse.Namespace, records: list[dict[str, Any]],
                   model: str) -> tuple[int, int, str, int, str]:
    """The table ``advise --model`` answers for: the one asked (--table-bytes/--rows, --dim, --dtype,
    --heads); where none is asked, the table of the runs' serve records of this model (the most
    measured), else the serving suite's; the words say which.  AdviseError naming the flag."""
    asked = {"dim": args.dim, "dtype": args.dtype, "heads": args.heads}
    size_given = args.table_bytes is not None or args.rows is not None
    if not size_given and all(v is None for v in asked.values()):
        shapes: dict[tuple, int] = {}
        for r in records:
            if r.get("kind") == "serve" and r.get("model") == model and r.get("status") == "ok":
                key = (int(r.get("table_bytes") or 0), int(r.get("dim") or 0), str(r.get("dtype")),
                       int(r.get("num_heads") or 0))
                if all(key) and key[2] in DTYPE_BYTES:
                    shapes[key] = shapes.get(key, 0) + 1
        if shapes:
            (table, dim, dtype, heads), n = max(shapes.items(), key=lambda kv: kv[1])
            return table, dim, dtype, heads, (f"table: none asked; the runs' serve records' table, {table / 2**30:.1f} "
                                              f"GiB of {dim} x {dtype}, {heads} heads ({n} records; --table-bytes, "
                                              "--dim, --dtype, --heads for another)")
        d = DEFAULT_SERVING_TABLE
        table = d["rows"] * d["dim"] * DTYPE_BYTES[d["dtype"]]
        return table, d["dim"], d["dtype"], d["heads"], (
            f"table: none asked; the serving suite's, {table / 2**30:.1f} GiB of {d['dim']} x {d['dtype']}, "
            f"{d['heads']} heads (--table-bytes, --dim, --dtype, --heads for another)")
    missing = [f"--{k}" for k, v in asked.items() if v is None] + ([] if size_given else ["--table-bytes or --rows"])
    if missing:
        raise AdviseError(f"{', '.join(missing)}: give the whole table (--table-bytes or --rows, --dim, --dtype, "
                          "--heads), or none of it for the runs' table")
    if args.dtype not in DTYPE_BYTES:
        raise AdviseError(f"--dtype: unknown {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    for name in ("dim", "heads"):
        if getattr(args, name) < 1:
            raise AdviseError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.rows is not None and args.rows < 1:
        raise AdviseError(f"--rows: the table must have at least one row, got {args.rows}")
    table = _size("table-bytes", args.table_bytes) if args.table_bytes else args.rows * args.dim * DTYPE_BYTES[args.dtype]
    return table, args.dim, args.dtype, args.heads, ""


def run_model_advise(args: argparse.Namespace) -> int:
    """``advise --model``: the serving answer (:mod:`ple_bench.advise.serving`)."""
    try:
        try:
            model = get_model(args.model)
        except ValueError as exc:
            raise AdviseError(f"--model: {exc}") from None
        if args.context is None or args.context < 1:
            raise AdviseError(f"--context: tokens of context per sequence, >= 1, are needed with --model "
                              f"(got {args.context})")
        if args.kv_dtype not in KV_DTYPES:
            raise AdviseError(f"--kv-dtype: unknown {args.kv_dtype!r}; allowed: {', '.join(KV_DTYPES)}")
        gpu = get_gpu_or_exit(args.gpu) if args.gpu else None
        if args.tpot_ms is not None and args.tpot_ms <= 0:
            raise AdviseError(f"--tpot-ms: must be positive, got {args.tpot_ms}")
        if not 0 < args.gpu_memory_utilization <= 1:
            raise AdviseError(f"--gpu-memory-utilization: a share in (0, 1], got {args.gpu_memory_utilization}")
        if args.etp < 1:
            raise AdviseError(f"--etp: must be >= 1, got {args.etp}")
        for flag in ("hbm_gbps", "h2d_gbps"):
            if getattr(args, flag, None) is not None and getattr(args, flag) <= 0:
                raise AdviseError(f"--{flag.replace('_', '-')}: must be positive, got {getattr(args, flag)}")
        if args.html:
            raise AdviseError("--html: the serving answer (--model) has no page of its own yet; the run's report "
                              "leads with it (python -m ple_bench report RUN_DIR)")
        runs = list(args.runs or [])
        runs_words = ""
        if not runs:
            runs = sorted(str(d) for d in Path(ARCHIVE).glob("2*") if (d / "meta.json").exists())
            if not runs:
                raise AdviseError("--runs: --model answers from stored runs (a serving run measures it: python -m "
                                  "ple_bench run --suite serving; then advise --model ... --runs results/RUN_DIR)")
            runs_words = f"runs: the {len(runs)} archived runs in {ARCHIVE}/ (--runs RUN_DIR ... for yours)"
        missing = [d for d in runs if not (Path(d) / "meta.json").exists()]
        if missing:
            raise AdviseError(f"--runs: not a run folder (no meta.json): {', '.join(missing)}")
        records, metas = load_runs(runs)
        table, dim, dtype, heads, table_words = _serving_table(args, records, model.name)
        ask = ServingAsk(model=model, context_len=args.context, kv_dtype=args.kv_dtype, table_bytes=table,
                         dim=dim, dtype=dtype, heads=heads,
                         hbm_bytes=_size("hbm-bytes", args.hbm_bytes) if args.hbm_bytes else None,
                         host_bytes=_size("host-bytes", args.host_bytes) if args.host_bytes else None,
                         etp=args.etp, tpot_ms=args.tpot_ms, gpu_memory_utilization=args.gpu_memory_utilization,
                         gpu=gpu, hbm_read_gbps=getattr(args, "hbm_gbps", None), h2d_gbps=getattr(args, "h2d_gbps", None),
                         table_words="; ".join(w for w in (table_words, runs_words) if w))
        advice = advise_serving(ask, records, metas, MODELS)
    except (AdviseError, ServingAdviseError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    print(json.dumps(advice.to_json(), indent=1) if args.json else format_serving_text(advice))
    return 0


MACHINE_FLAGS = (("h2d_gbps", "--h2d-gbps"), ("hbm_read_gbps", "--hbm-gbps"),
                 ("host_gather_rows_per_s", "--host-gather-rows-per-s"), ("sms", "--sms"))


def machine_asked(args: argparse.Namespace, measured: Machine) -> Machine:
    """The machine to predict for: the measured one, then ``--machine FILE``'s keys, then the
    flags, each figure marked given by where it came from; AdviseError naming the file / key / flag."""
    m = measured
    try:
        if getattr(args, "machine", None):
            m = m.given(f"--machine {args.machine}", **read_machine_file(args.machine))
        for key, flag in MACHINE_FLAGS:
            value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
            if value is not None:
                m = m.given(flag, **{key: value})
        if getattr(args, "gpu_hbm_bytes", None):
            try:
                hbm = parse_size(str(args.gpu_hbm_bytes), exact=False)
            except BadValue as exc:
                raise AdviseError(f"--gpu-hbm-bytes: {exc}") from None
            m = m.given("--gpu-hbm-bytes", hbm_bytes=hbm)
        if args.host_cores is not None:
            m = m.given("--host-cores", host_cores=args.host_cores)
    except MachineError as exc:
        raise AdviseError(str(exc)) from None
    return m


def get_gpu_or_exit(name: str):
    """The preset ``--gpu NAME``; AdviseError naming the flag and listing the presets."""
    try:
        return get_gpu(name)
    except GpuError as exc:
        raise AdviseError(str(exc)) from None


def run_advise(args: argparse.Namespace) -> int:
    if getattr(args, "model", None):
        return run_model_advise(args)
    try:
        missing = [f for f, v in (("--table-bytes or --rows", args.table_bytes or args.rows), ("--dim", args.dim),
                                  ("--dtype", args.dtype), ("--heads", args.heads)) if v is None]
        if missing:
            raise AdviseError(f"{', '.join(missing)}: required for a decode step's answer (or --model for the "
                              "serving answer)")
        if not args.tokens:
            raise AdviseError("--tokens: give the tokens per step (e.g. 64,256,512), or --model for the serving answer")
        if getattr(args, "gpu", None):
            get_gpu_or_exit(args.gpu)
        def size(name, value):  # "47.7GiB" rounds to whole bytes here (a suite wants them exact)
            try:
                return parse_size(str(value), exact=False)
            except BadValue as exc:
                raise AdviseError(f"--{name}: {exc} (e.g. 47.7GiB, 200GB, 51200286720)") from None

        try:
            tokens = [int(t) for t in str(args.tokens).split(",") if t.strip()]
        except ValueError:
            raise AdviseError(f"--tokens: {args.tokens!r} is not a comma-separated list of integers") from None
        if not tokens or any(t < 1 for t in tokens):
            raise AdviseError(f"--tokens: give one or more positive token counts per step, got {args.tokens!r}")
        if args.dtype not in DTYPE_BYTES:
            raise AdviseError(f"--dtype: unknown {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
        if args.rows is not None and args.rows < 1:
            raise AdviseError(f"--rows: the table must have at least one row, got {args.rows}")
        for name in ("dim", "heads"):
            if getattr(args, name) < 1:
                raise AdviseError(f"--{name}: must be >= 1, got {getattr(args, name)}")
        row_bytes = args.dim * DTYPE_BYTES.get(args.dtype, 1)
        table = size("table-bytes", args.table_bytes) if args.table_bytes else args.rows * row_bytes
        if args.etp < 1 or args.nodes < 1 or args.etp % args.nodes:
            raise AdviseError(f"--etp / --nodes: an ETP group of {args.etp} over {args.nodes} nodes is not possible "
                              "(both >= 1, the group split evenly over the nodes)")
        if args.nodes > 1 and not args.link_gbps:
            raise AdviseError("--link-gbps: an ETP group across nodes needs the inter-node bandwidth")
        if args.link_gbps is not None and args.link_gbps <= 0:
            raise AdviseError(f"--link-gbps: must be positive, got {args.link_gbps}")
        if args.link_latency_us < 0:
            raise AdviseError(f"--link-latency-us: must be >= 0, got {args.link_latency_us}")
        if args.host_cores is not None and args.host_cores < 1:
            raise AdviseError(f"--host-cores: must be >= 1, got {args.host_cores}")
        ask = compute_asked(args)  # sets args.compute_us (0 for decoder layers: their time is measured)
        machine_asked(args, Machine())  # a bad machine file, key or flag fails before any self-run
        if args.ids is not None:
            wanted_ids(args.ids)  # a bad spec fails before any self-run
        runs = args.runs
        if runs and args.functional_check:
            raise AdviseError("--functional-check runs advise's own cases: not with --runs")
        if not runs and ask.kind != "matmul":
            raise AdviseError(f"--compute {args.compute}: advise runs its own cases for the matmul chain only; "
                              "give --runs with a decoder run (python -m ple_bench run --suite decoder)")
        if not runs:
            # a self-run measures: the engine (and torch) load only then, so advise --runs does not
            from .self_run import NO_GPU, functional_case_count, self_run

            if not gpu_available() and not args.functional_check:
                raise AdviseError(NO_GPU.format(n=functional_case_count(args, tokens)))
            runs = self_run(args, table, tokens)
            if isinstance(runs, int):
                return runs
        missing = [d for d in runs if not (Path(d) / "meta.json").exists()]
        if missing:
            raise AdviseError(f"--runs: not a run folder (no meta.json): {', '.join(missing)}")
        hbm = size("hbm-bytes", args.hbm_bytes) if args.hbm_bytes else None
        host = size("host-bytes", args.host_bytes) if args.host_bytes else None
        if hbm is not None and host is not None and table / args.etp > hbm and table / args.nodes > host:
            raise AdviseError(f"the table ({table / 2**30:.1f} GiB) fits neither the HBM budget "
                              f"({hbm / 2**30:.1f} GiB per GPU, ETP {args.etp}) nor the host budget "
                              f"({host / 2**30:.1f} GiB per node)")

        records, metas = load_runs(runs)
        if is_functional(records):
            raise AdviseError(f"{FUNCTIONAL_TEXT}: the runs given are functional (CPU) runs, whose times are the "
                              "CPU's; give GPU runs (--runs RUN_DIR ..., e.g. docs/runs/*)")
        records = records_for_ids(records, args.ids)
        records, measured_ask, compute_notes = records_for_compute_ask(records, ask)
        steps = [r for r in records if r.get("status") == "ok" and r.get("kind") == "step"
                 and r.get("mode", "gpu") != "functional"]
        advice = advise(table_bytes=table, dim=args.dim, dtype=args.dtype, heads=args.heads, tokens=tokens,
                        compute_us=args.compute_us, records=steps,
                        hbm_bytes=hbm if args.etp == 1 else None, host_bytes=host if args.nodes == 1 else None,
                        graph_modes=args.graph,
                        ids=str(steps[0].get("ids")) if args.ids and steps else None)  # as stored
        name_the_scope(advice, ask, measured_ask, compute_notes)
        model = build_model(records, metas)
        if model.fits:
            target = machine_asked(args, model.rates.machine)
            host_cores = args.host_cores or (target.host_cores if "given" in target.sources.get("host_cores", "")
                                             else None)
            w = WhatIf(etp=args.etp, nodes=args.nodes, link_gbps=args.link_gbps,
                       link_latency_us=args.link_latency_us, host_cores=host_cores,
                       machine=target if model.rates.machine.differs(target) else None)
            if args.etp > 1 and model.rates.reduce_busbw_gbps is None:
                raise AdviseError("--etp: no all-reduce was measured in the runs given (add a topology run: "
                                  "python -m ple_bench run --suite topology on 2+ GPUs)")
            # another GPU's memory bounds the resident table where no --hbm-bytes budget was given
            gpu_hbm = target.hbm_bytes if "given" in target.sources.get("hbm_bytes", "") else None
            advice.model = model_advice(model, table_bytes=table, row_bytes=row_bytes, heads=args.heads,
                                        tokens=tokens, compute_us=args.compute_us, w=w, hbm_bytes=hbm or gpu_hbm,
                                        host_bytes=host, graph_modes=args.graph,
                                        compute_words=measured_ask.label if ask.kind == "decoder" else None,
                                        ids=advice.ids or None)  # the traffic the answer holds for
            # never a predicted figure in the headline where a measured one exists: the model's verdict
            # leads only where nothing was measured at the asked shape, or a what-if was asked
            asked_what_if = args.etp > 1 or args.nodes > 1 or host_cores is not None or w.machine is not None
            if asked_what_if or all(a.verdict == NO_VERDICT for a in advice.answers):
                advice.measured_verdict, advice.verdict = advice.verdict, advice.model.verdict
        scoped_verdict(advice)
        if args.html:
            write_advice_html(advice, args, Path(args.html))
    except AdviseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    if args.json:
        print(json.dumps(advice.to_json(), indent=1))
    else:
        print(format_text(advice) if getattr(args, "all", False) else format_short(advice))
    return 0
