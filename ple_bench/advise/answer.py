"""``advise``'s answer: where should the PLE table live, and how should it be looked up, for this
shape -- answered from measured runs, the answer first (the verb, its flags and their checks:
:mod:`ple_bench.commands.advise`).

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
import math
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from .compute_kind import EXAMPLES as COMPUTE_EXAMPLES
from .compute_kind import ComputeAsk, parse_compute, records_of_compute
from ..record import resident_figures
from ..verdict import (AS_FAST, EQUAL_PCT, FASTER, NO_VERDICT, UNDECIDED, Entry, candidates, ratio_detail,
                              compute_of, newest_verdicts, scope)
from ..units import DTYPE_BYTES

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
    # the verdict's own interval: over processes where both steps were repeated, else within one process
    d = ratio_detail(r, (every or {}).get((str(r.get("_run_id")), str(r.get("offload_baseline")))))
    lo, hi = d.low, d.high
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
            elif word == UNDECIDED:
                ans.recommendation = (f"undecided: the best pinned step ({what}) may be as fast or slower: {vs}; "
                                      "its interval straddles HBM + 5 % (more processes decide it: run --processes)")
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
        if (a.verdict in host) == (b.verdict in host) or {NO_VERDICT, UNDECIDED} & {a.verdict, b.verdict}:
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
    hbm = [a.tokens for a in answers if a.verdict not in (FASTER, AS_FAST, NO_VERDICT, UNDECIDED)]
    open_ = [a.tokens for a in answers if a.verdict == UNDECIDED]
    none = [a.tokens for a in answers if a.verdict == NO_VERDICT]
    def said(a: TokenAnswer) -> str:
        b = _best(a)
        if b is None or a.verdict == NO_VERDICT:
            return f"{a.tokens} tokens {a.verdict}"
        ci = f", 95 % CI {b.ci_low:.3f}-{b.ci_high:.3f}" if b.ci_low is not None else ""
        return f"{a.tokens} tokens {a.verdict} ({b.step_ms / b.baseline_ms:.3f}{ci})"
    words = "; ".join(said(a) for a in answers)
    tail = f" Measured, per token count (pinned / HBM): {words}."
    if open_:
        tail = (f" Undecided at {', '.join(map(str, open_))} tokens: the ratio's 95 % interval reaches past HBM + "
                f"{EQUAL_PCT:.0f} % (more processes decide it: run --processes)." + tail)
    if open_ and not host and not hbm:
        return "No answer yet:" + tail
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

