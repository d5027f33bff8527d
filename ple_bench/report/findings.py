"""Findings: plain-word statements generated from a run's stored records.

Every finding is computed from the data it cites and is only made when the data
can support it (matched pairs for effects, at least three sizes spanning 8x for
trends, a ceiling measured on the same run for % of ceiling).  A functional
(CPU, host-timer) run gets no performance claims at all, only the statement
that its numbers are not GPU performance.

Assumed meanings of step metrics (from the record schema): ``exposed_ms`` is the
lookup time not hidden behind compute, ``overlap_efficiency`` the hidden share
(0..1), ``compute_slowdown`` = in-step compute / compute alone - 1 (0 = the
side-stream lookup does not slow the compute), ``offload_overhead`` = step /
device-resident step - 1 (see ``ple_bench/step.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from .data import (
    Run, fmt, fmt_bytes, num, pairs, points, single_rank, slice_series, status_counts,
    topology,
)

# Differences smaller than this (in %) are called "no measurable difference".
EFFECT_PCT = 5.0
# A GB/s trend over table size needs at least this ratio between ends to be called rising/falling.
TREND_RATIO = 1.15
NOISY_CV = 0.10


@dataclass
class Finding:
    topic: str
    text: str
    level: str = "info"  # info | warn


def pct_of_ceiling(record: dict[str, Any]) -> float | None:
    gbps, ceiling = num(record.get("gbps")), num(record.get("ceiling_gbps"))
    if gbps is not None and ceiling:
        return 100.0 * gbps / ceiling
    return num(record.get("pct_of_ceiling"))


def _shape(record: dict[str, Any]) -> str:
    parts = [str(record.get("dtype") or "?")]
    if num(record.get("row_bytes")) is not None:
        parts.append(f"{int(record['row_bytes'])} B rows")
    if num(record.get("table_bytes")) is not None:
        parts.append(f"{fmt_bytes(record['table_bytes'])} table")
    tokens, heads = num(record.get("num_tokens")), num(record.get("num_heads"))
    if tokens is not None:
        parts.append(f"{int(tokens)} tokens" + (f" × {int(heads)} heads" if heads and heads > 1 else ""))
    return ", ".join(parts)


def _range_pct(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    if abs(hi - lo) < 0.5:
        return f"{lo:+.0f}%"
    return f"{lo:+.0f}% to {hi:+.0f}%"


def _list(values: Sequence[Any]) -> str:
    return ", ".join(fmt(v) for v in values)


def _lookups(run: Run) -> list[dict[str, Any]]:
    return [r for r in run.ok if (r.get("kind") or "lookup") == "lookup"]


def _steps(run: Run) -> list[dict[str, Any]]:
    return [r for r in run.ok if r.get("kind") == "step"]


def status_finding(run: Run) -> list[Finding]:
    counts = status_counts(run.records)
    total = len(run.records)
    if total == 0:
        return [Finding("status", "The run holds no records.", "warn")]
    text = f"{counts['ok']} of {total} cases measured"
    rest = [f"{counts[s]} {s}" for s in ("skipped", "failed", "invalid") if counts.get(s)]
    if rest:
        text += "; " + ", ".join(rest) + " (reasons under “Not measured”)"
    text += "."
    level = "warn" if counts.get("failed") or counts.get("invalid") else "info"
    if run.meta.get("status") not in (None, "complete"):
        text += f" The run's status is “{run.meta.get('status')}”: it did not finish."
        level = "warn"
    return [Finding("status", text, level)]


def ceiling_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if single_rank(r) and pct_of_ceiling(r) is not None]
    by_impl: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_impl.setdefault(str(r.get("impl")), []).append(r)
    for impl, rs in sorted(by_impl.items()):
        best = max(rs, key=lambda r: pct_of_ceiling(r) or 0.0)
        typical = statistics.median(pct_of_ceiling(r) or 0.0 for r in rs)
        name = best.get("ceiling") or "its"
        text = (f"{impl} reaches at best {pct_of_ceiling(best):.0f}% of the {name} ceiling "
                f"({fmt(best.get('gbps'))} of {fmt(best.get('ceiling_gbps'))} GB/s) at {_shape(best)}")
        largest = max(rs, key=lambda r: (num(r.get("table_bytes")) or 0, num(r.get("num_tokens")) or 0))
        if largest is not best and len(rs) > 1:
            text += (f"; with the largest table ({_shape(largest)}) it reaches "
                     f"{pct_of_ceiling(largest):.0f}%")
        rr = num(best.get("pct_of_random_row_ceiling"))
        if rr is not None:
            text += f" ({rr:.0f}% of the random-row ceiling)"
        text += f"; median over its {len(rs)} single-GPU lookups: {typical:.0f}%."
        out.append(Finding("ceiling", text))
    return out


def table_size_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if single_rank(r) and num(r.get("gbps")) is not None]
    if not recs:
        return out
    sl = slice_series(recs, "table_bytes", ["impl", "dtype"], max_series=64)
    phrases: dict[str, list[str]] = {}
    for key, rs in sl.series.items():
        pts = points(rs, "table_bytes", "gbps")
        if len(pts) < 3 or pts[-1][0] / pts[0][0] < 8:
            continue
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        ratio = y1 / y0 if y0 else float("inf")
        if ratio > TREND_RATIO:
            verb = "rises"
        elif ratio < 1 / TREND_RATIO:
            verb = "falls"
        else:
            verb = "stays flat (within 15%)"
        phrase = (f"{sl.label(key)}: GB/s {verb} from {fmt(y0)} at {fmt_bytes(x0)} "
                  f"to {fmt(y1)} at {fmt_bytes(x1)}")
        phrases.setdefault(str(dict(zip(sl.label_axes, key)).get("impl")), []).append(phrase)
    for impl, ps in sorted(phrases.items()):
        out.append(Finding("table size", "With table size — " + "; ".join(ps) + "."))
    return out


def dtype_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if num(r.get("median_ms")) is not None]
    groups = pairs(recs, "dtype")
    # ratios[impl][(dtype, ref)] -> list of (time ratio, gbps ratio)
    ratios: dict[str, dict[tuple[str, str], list[tuple[float, float | None]]]] = {}
    for g in groups:
        ref = "bf16" if "bf16" in g else sorted(g, key=str)[0]
        base = g[ref]
        for dtype, r in g.items():
            if dtype == ref:
                continue
            t = num(r.get("median_ms")) / num(base.get("median_ms"))
            gb = (num(r.get("gbps")) / num(base.get("gbps"))
                  if num(r.get("gbps")) and num(base.get("gbps")) else None)
            ratios.setdefault(str(r.get("impl")), {}).setdefault((str(dtype), str(ref)), []).append((t, gb))
    for impl, by_pair in sorted(ratios.items()):
        parts = []
        for (dtype, ref), vals in sorted(by_pair.items()):
            t = statistics.median(v[0] for v in vals)
            gbs = [v[1] for v in vals if v[1] is not None]
            change = (t - 1) * 100
            if abs(change) < EFFECT_PCT:
                p = f"{dtype} lookups take about the same time as {ref} (within {EFFECT_PCT:.0f}%)"
            else:
                p = f"{dtype} lookups take {t:.2f}× the {ref} time"
            if gbs:
                p += f" at {statistics.median(gbs):.2f}× its GB/s"
            p += f" (median over {len(vals)} matched case{'s' if len(vals) != 1 else ''})"
            parts.append(p)
        out.append(Finding("dtype", f"{impl}: " + "; ".join(parts) + "."))
    return out


def prefetch_findings(run: Run) -> list[Finding]:
    out = []
    steps = [r for r in _steps(run) if _step_time(r) is not None]
    groups = [g for g in pairs(steps, "prefetch") if True in g and False in g]
    by_impl: dict[str, list[tuple[float, float, dict, dict]]] = {}
    for g in groups:
        on, off = g[True], g[False]
        change = (_step_time(on) / _step_time(off) - 1) * 100
        by_impl.setdefault(str(on.get("impl")), []).append(
            (num(on.get("compute_us")) or 0.0, change, on, off))
    for impl, rows in sorted(by_impl.items()):
        rows.sort(key=lambda t: t[0])
        pays = [r for r in rows if r[1] < -EFFECT_PCT]
        costs = [r for r in rows if r[1] > EFFECT_PCT]
        same = [r for r in rows if abs(r[1]) <= EFFECT_PCT]
        parts = []
        if pays:
            parts.append(f"prefetch pays at compute_us = {_list(sorted({r[0] for r in pays}))} "
                         f"(step time {_range_pct([r[1] for r in pays])})")
        if same:
            parts.append(f"it makes no measurable difference (within {EFFECT_PCT:.0f}%) at compute_us = "
                         f"{_list(sorted({r[0] for r in same}))}")
        if costs:
            parts.append(f"it costs time at compute_us = {_list(sorted({r[0] for r in costs}))} "
                         f"(step time {_range_pct([r[1] for r in costs])})")
        text = f"{impl} decode steps: " + "; ".join(parts) + "."
        exposed = [(r[0], num(r[2].get("exposed_ms")), num(r[3].get("exposed_ms"))) for r in rows]
        exposed = [e for e in exposed if e[1] is not None and e[2] is not None]
        if exposed:
            cu, on_ms, off_ms = max(exposed, key=lambda e: e[0])
            text += (f" At compute_us = {fmt(cu)} the exposed lookup time is {fmt(on_ms)} ms with "
                     f"prefetch vs {fmt(off_ms)} ms without.")
        out.append(Finding("prefetch", text))
    return out


def _step_time(r: dict[str, Any]) -> float | None:
    return num(r.get("step_ms")) if num(r.get("step_ms")) is not None else num(r.get("median_ms"))


def overlap_findings(run: Run) -> list[Finding]:
    out = []
    steps = [r for r in _steps(run) if r.get("prefetch")]
    by_impl: dict[str, list[dict[str, Any]]] = {}
    for r in steps:
        by_impl.setdefault(str(r.get("impl")), []).append(r)
    for impl, rs in sorted(by_impl.items()):
        parts = []
        eff = [r for r in rs if num(r.get("overlap_efficiency")) is not None]
        if eff:
            best = max(eff, key=lambda r: num(r.get("overlap_efficiency")))
            worst = min(eff, key=lambda r: num(r.get("overlap_efficiency")))
            parts.append(f"overlap efficiency ranges {num(worst['overlap_efficiency']) * 100:.0f}% "
                         f"(compute_us = {fmt(worst.get('compute_us'))}) to "
                         f"{num(best['overlap_efficiency']) * 100:.0f}% (compute_us = {fmt(best.get('compute_us'))})")
        slow = [num(r.get("compute_slowdown")) for r in rs if num(r.get("compute_slowdown")) is not None]
        if slow:
            worst_slow = max(slow)
            if worst_slow < EFFECT_PCT / 100:
                parts.append(f"the side-stream lookup slows the main-stream compute by at most "
                             f"{worst_slow * 100:.1f}% (below {EFFECT_PCT:.0f}%: no measurable SM stealing)")
            else:
                parts.append(f"the side-stream lookup slows the main-stream compute by up to "
                             f"{worst_slow * 100:.0f}%")
        overhead = [num(r.get("offload_overhead")) for r in rs if num(r.get("offload_overhead")) is not None]
        if overhead:
            parts.append(f"offload overhead vs the device-resident table {min(overhead) * 100:+.1f}% to "
                         f"{max(overhead) * 100:+.1f}% of step time")
        if parts:
            out.append(Finding("overlap", f"{impl} with prefetch: " + "; ".join(parts) + "."))
    return out


def topology_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in run.ok if num(r.get("median_ms")) is not None]
    if len({topology(r) for r in recs}) < 2:
        return out
    by_impl: dict[str, dict[str, list[float]]] = {}
    extras: dict[str, dict[str, dict[str, list[float]]]] = {}
    for g in pairs(recs, "topology"):
        ref_label = "tp1 etp1 dp1" if "tp1 etp1 dp1" in g else None
        if ref_label is None:
            continue
        base = g[ref_label]
        for label, r in g.items():
            if label == ref_label:
                continue
            impl = str(r.get("impl"))
            by_impl.setdefault(impl, {}).setdefault(label, []).append(
                num(r.get("median_ms")) / num(base.get("median_ms")))
            for key in ("gather_ms", "reduce_ms", "rank_spread_ms"):
                if num(r.get(key)) is not None:
                    extras.setdefault(impl, {}).setdefault(label, {}).setdefault(key, []).append(num(r.get(key)))
    for impl, by_label in sorted(by_impl.items()):
        parts = []
        for label, ratios in sorted(by_label.items()):
            p = f"at {label} a lookup takes {statistics.median(ratios):.2f}× the single-GPU time"
            ex = extras.get(impl, {}).get(label, {})
            detail = [f"{k.replace('_ms', '').replace('_', ' ')} {fmt(statistics.median(v))} ms"
                      for k, v in ex.items()]
            if detail:
                p += " (" + ", ".join(detail) + ")"
            parts.append(p)
        out.append(Finding("topology", f"{impl}: " + "; ".join(parts) +
                           " — ids per DP rank held fixed, matched cases only."))
    return out


def graph_and_cache_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if num(r.get("median_ms"))]
    by_impl: dict[str, dict[str, list[float]]] = {}
    for r in recs:
        for key in ("graph_median_ms", "hot_median_ms"):
            if num(r.get(key)) is not None:
                by_impl.setdefault(str(r.get("impl")), {}).setdefault(key, []).append(
                    num(r.get(key)) / num(r.get("median_ms")))
    for impl, d in sorted(by_impl.items()):
        parts = []
        if "graph_median_ms" in d:
            parts.append(f"CUDA-graph replay of the lookup takes {statistics.median(d['graph_median_ms']) * 100:.0f}% "
                         f"of the eager time")
        if "hot_median_ms" in d:
            parts.append(f"a warm-L2 lookup takes {statistics.median(d['hot_median_ms']) * 100:.0f}% of the cold one")
        n = max(len(v) for v in d.values())
        out.append(Finding("graphs/cache", f"{impl}: " + "; ".join(parts) + f" (median over {n} cases)."))
    return out


def noise_findings(run: Run) -> list[Finding]:
    out = []
    noisy = [r for r in run.ok if (num(r.get("cv")) or 0) > NOISY_CV]
    if noisy:
        worst = max(noisy, key=lambda r: num(r.get("cv")))
        out.append(Finding("noise", f"{len(noisy)} case{'s' if len(noisy) != 1 else ''} had a coefficient of "
                           f"variation above {NOISY_CV:.0%} (worst {num(worst['cv']):.0%}, {worst.get('case_id')}); "
                           f"treat their numbers with care.", "warn"))
    throttled = [r for r in run.ok if (num(r.get("throttled_samples")) or 0) > 0]
    if throttled:
        total = sum(int(num(r.get("throttled_samples"))) for r in throttled)
        out.append(Finding("noise", f"{total} samples in {len(throttled)} cases were dropped because the SM clock "
                           f"was throttled.", "warn"))
    return out


def findings(run: Run) -> list[Finding]:
    """All findings for a run, most important first."""
    out: list[Finding] = []
    if run.functional:
        out.append(Finding(
            "mode", "CPU functional run, host timer: these numbers show that the code paths run; they are "
                    "not GPU performance and support no performance claim.", "warn"))
        out += status_finding(run)
        return out
    if run.mode == "unknown":
        out.append(Finding("mode", "The run does not say whether it ran on a GPU (no mode in meta.json or "
                                   "records); read the numbers with that in mind.", "warn"))
    out += status_finding(run)
    if not run.ceilings and any(num(r.get("gbps")) for r in run.ok):
        out.append(Finding("ceiling", "No bandwidth ceilings were measured on this run, so GB/s cannot be put "
                                      "against what the hardware can do."))
    for fn in (ceiling_findings, table_size_findings, dtype_findings, prefetch_findings, overlap_findings,
               topology_findings, graph_and_cache_findings, noise_findings):
        out += fn(run)
    return out


__all__ = ["Finding", "findings", "pct_of_ceiling"]
