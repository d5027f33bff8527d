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
the resident step a server would run instead - 1 (``ple_bench/record.py``, ``Peers``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..record import as_record
from .data import (
    REFERENCE_PATH, Run, axis_value, fmt, fmt_bytes, key_of, pairs, points, single_rank,
    status_counts, topology,
)
from ..verdict import verdict_lines, verdicts
from .sections import (
    WORKLOAD_AXES, decode_steps, hit_rate, path_groups, path_of, step_config_axes,
    step_config_label, workload_label,
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
    group: str = "general"  # general | paths | overlap: where the page lists it


GROUP_TITLES = {"general": "Run and backends", "paths": "Lookup paths side by side",
                "overlap": "Decode-step overlap"}


# A lookup above this share of its ceiling says the ceiling is wrong for it, not that it is fast
# (the record's ``ceiling_exceeded``).
from ..record import CEILING_SLACK_PCT  # noqa: E402


def pct_of_ceiling(record: Mapping[str, Any]) -> float | None:
    """The record's ``pct_of_ceiling`` (the schema's, :func:`ple_bench.record.derive`)."""
    return as_record(record).pct_of_ceiling


def _exceeded(record: dict[str, Any]) -> bool:
    """The record's ``ceiling_exceeded`` flag (derived from its share where it lacks one)."""
    flag = record.get("ceiling_exceeded")
    if isinstance(flag, bool):
        return flag
    return (pct_of_ceiling(record) or 0.0) > CEILING_SLACK_PCT


def _shape(record: dict[str, Any]) -> str:
    parts = [str(record.get("dtype") or "?")]
    if record.row_bytes is not None:
        parts.append(f"{int(record['row_bytes'])} B rows")
    if record.table_bytes is not None:
        parts.append(f"{fmt_bytes(record['table_bytes'])} table")
    tokens, heads = record.num_tokens, record.num_heads
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
    total = run.n_expected
    if total == 0 or not run.records:
        return [Finding("status", "The run holds no records: records.jsonl is empty"
                                  + (f" ({total} cases expected)." if total else "."), "warn")]
    text = f"{counts['ok']} of {total} cases measured"
    rest = [f"{counts[s]} {s}" for s in ("skipped", "failed", "invalid") if counts.get(s)]
    missing = total - len(run.records)
    if missing:
        rest.append(f"{missing} not reached")
    if rest:
        text += "; " + ", ".join(rest) + " (listed under “Not measured”)"
    text += "."
    level = "warn" if counts.get("failed") or counts.get("invalid") else "info"
    if run.lost:
        text += (f" {len(run.lost)} line(s) of records.jsonl could not be read (line "
                 f"{', '.join(str(x.line) for x in run.lost)}): their cases are counted as not reached.")
        level = "warn"
    if run.meta.status not in (None, "complete"):
        text += f" The run's status is “{run.meta.status}”: it did not finish."
        level = "warn"
    return [Finding("status", text, level)]


def ceiling_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if single_rank(r) and pct_of_ceiling(r) is not None]
    by_impl: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_impl.setdefault(str(r.get("impl")), []).append(r)
    for impl, rs in sorted(by_impl.items()):
        above = [r for r in rs if _exceeded(r)]
        bound = [r for r in rs if r not in above]  # lookups whose ceiling binds them
        if bound:
            best = max(bound, key=lambda r: pct_of_ceiling(r) or 0.0)
            typical = statistics.median(pct_of_ceiling(r) or 0.0 for r in bound)
            name = best.get("ceiling") or "its"
            text = (f"{impl} reaches at best {pct_of_ceiling(best):.0f}% of the {name} ceiling "
                    f"({fmt(best.get('gbps'))} of {fmt(best.get('ceiling_gbps'))} GB/s) at {_shape(best)}")
            largest = max(bound, key=lambda r: (r.table_bytes or 0, r.num_tokens or 0))
            if largest is not best and len(bound) > 1:
                text += (f"; with the largest table ({_shape(largest)}) it reaches "
                         f"{pct_of_ceiling(largest):.0f}%")
            text += f"; median over its {len(bound)} single-GPU lookups within their ceiling: {typical:.0f}%."
            out.append(Finding("ceiling", text))
        if above:
            out.append(Finding("ceiling", _exceeded_text(impl, above), "warn"))
    return out


def _ceiling_label(record: dict[str, Any]) -> str:
    """The ceiling a record is held against, with its own random-row entry when it has one."""
    name = str(record.get("ceiling"))
    key = record.get("random_row_ceiling")
    return f"{name} [{key}]" if key else name


def _kernel(record: dict[str, Any]) -> str:
    """The lookup kernel a record's path ran (``kernel_ran``, else the case's ``kernel`` axis), or ""."""
    return str(record.get("kernel_ran") or record.get("kernel") or "")


def _path_label(impl: str, above: list[dict[str, Any]]) -> str:
    """``impl``, with the kernels its lookups above their ceiling ran (``pinned_uva (kernel
    dedup_triton)``): a path's kernels read differently, and a finding names the one it means."""
    kernels = sorted({k for k in map(_kernel, above) if k})
    if not kernels:
        return impl
    return f"{impl} ({'kernel' if len(kernels) == 1 else 'kernels'} {', '.join(kernels)})"


def _exceeded_text(impl: str, above: list[dict[str, Any]]) -> str:
    """Lookups above CEILING_SLACK_PCT of their ceiling: the ceiling is wrong for them."""
    worst = max(above, key=lambda r: pct_of_ceiling(r) or 0.0)
    names = sorted({_ceiling_label(r) for r in above})
    impl = _path_label(impl, above)
    if len(above) == 1:
        return (f"The ceiling {names[0]} does not bind this {impl} case ({pct_of_ceiling(worst):.0f}% of it, "
                f"at {_shape(worst)}): the ceiling is wrong for it (it does not bound what the lookup does, "
                "e.g. rows served from a GPU-resident cache or from L2, or bytes counted differently); "
                "the lookup is not faster than the hardware.")
    which = f"the ceiling {names[0]} does" if len(names) == 1 else f"the ceilings {', '.join(names)} do"
    return (f"{len(above)} {impl} lookups exceed {CEILING_SLACK_PCT:.0f}% of their ceiling: {which} not bind "
            f"these cases (up to {pct_of_ceiling(worst):.0f}%, at {_shape(worst)}): the ceiling is wrong for "
            "them (it does not bound what they do, e.g. rows served from a GPU-resident cache or from L2, or "
            "bytes counted differently); the lookups are not faster than the hardware.")


def table_size_findings(run: Run) -> list[Finding]:
    """Per path: how GB/s changes with table size, at each token count, with the
    ends as % of the row-size pinned (or device) random-row ceiling when stored.
    Prefetch / graph variants are left out when the plain eager lookup was swept."""
    out = []
    recs = [r for r in _lookups(run) if single_rank(r) and r.gbps is not None]
    plain = [r for r in recs if not r.get("prefetch") and r.get("graph") in (None, "", "eager")]
    recs = plain or recs
    axes = [a for a in WORKLOAD_AXES if a != "vocab_size"]
    series: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        series.setdefault((path_of(r), str(r.get("dtype")), r.row_bytes) + key_of(r, axes), []).append(r)
    phrases: dict[tuple, list[tuple[float, str]]] = {}
    for key, rs in series.items():
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
        ends = [f"{fmt(y0)} at {fmt_bytes(x0)}", f"{fmt(y1)} at {fmt_bytes(x1)}"]
        pcts = points(rs, "table_bytes", "pct_of_ceiling")
        names = {r.get("ceiling") for r in rs}
        rr = (next(iter(names)),) if len(names) == 1 and None not in names and len(pcts) == len(pts) else None
        if rr:
            ends = [f"{e} ({p:.0f}%)" for e, (_, p) in zip(ends, (pcts[0], pcts[-1]))]
        change = f", {(ratio - 1) * 100:+.0f}%" if verb != "stays flat (within 15%)" else ""
        sample = rs[0]
        where = workload_label(sample, with_shape=False).split(", ", 1)[-1] if sample.table_bytes else ""
        phrase = f"at {where}: GB/s {verb} from {ends[0]} to {ends[1]}{change}"
        head = (path_of(sample), str(sample.get("dtype")), sample.row_bytes,
                rr[0] if rr else None)
        phrases.setdefault(head, []).append((sample.num_tokens or 0.0, phrase))
    for (path, dtype, rb, rr_name), ps in sorted(phrases.items(), key=lambda kv: str(kv[0])):
        shape = f"{dtype}, {int(rb)} B rows" if rb else dtype
        note = f" (in brackets: % of the {rr_name} ceiling)" if rr_name else ""
        text = f"{path} ({shape}) with table size{note} — " + "; ".join(p for _, p in sorted(ps)) + "."
        out.append(Finding("table size", text, group="paths"))
    return out


def dtype_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if r.median_ms is not None]
    groups = pairs(recs, "dtype")
    # ratios[impl][(dtype, ref)] -> list of (time ratio, gbps ratio)
    ratios: dict[str, dict[tuple[str, str], list[tuple[float, float | None]]]] = {}
    for g in groups:
        ref = "bf16" if "bf16" in g else sorted(g, key=str)[0]
        base = g[ref]
        for dtype, r in g.items():
            if dtype == ref:
                continue
            t = r.median_ms / base.median_ms
            gb = (r.gbps / base.gbps
                  if r.gbps and base.gbps else None)
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
    """Step time with vs without prefetch, on matched pairs only (same path,
    tokens, graph mode, compute ...), per path and token count."""
    out = []
    all_steps = [r for r in _steps(run) if _step_time(r) is not None]
    groups = [g for g in pairs(all_steps, "prefetch") if True in g and False in g]
    by_path: dict[tuple[str, float], list[tuple[float, float, dict, dict]]] = {}
    for g in groups:
        on, off = g[True], g[False]
        change = (_step_time(on) / _step_time(off) - 1) * 100
        key = (path_of(on), on.num_tokens or 0.0, str(on.get("graph") or "eager"))
        by_path.setdefault(key, []).append((on.compute_us or 0.0, change, on, off))
    for (path, tokens, graph), rows in sorted(by_path.items()):
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
        text = f"{path}, {int(tokens)} tokens, graph {graph}, decode steps: " + "; ".join(parts) + "."
        exposed = [(r[0], r[2].exposed_ms, r[3].exposed_ms) for r in rows]
        exposed = [e for e in exposed if e[1] is not None and e[2] is not None]
        if exposed:
            cu, on_ms, off_ms = max(exposed, key=lambda e: e[0])
            text += (f" At compute_us = {fmt(cu)} the exposed lookup time is {fmt(on_ms)} ms with "
                     f"prefetch vs {fmt(off_ms)} ms without.")
        text += f" ({len(rows)} matched pair{'s' if len(rows) != 1 else ''}.)"
        out.append(Finding("prefetch", text, group="overlap"))
    return out


def _step_time(r: dict[str, Any]) -> float | None:
    return r.step_ms if r.step_ms is not None else r.median_ms


# Below this share the lookup is called "not hidden at all".
HIDES_NOTHING = 0.05


def _cu_range(rs: Sequence[dict[str, Any]]) -> str:
    cus = sorted({r.compute_us or 0.0 for r in rs})
    return f"compute_us = {fmt(cus[0])}" if len(cus) == 1 else f"compute_us {fmt(cus[0])}–{fmt(cus[-1])}"


def overlap_findings(run: Run) -> list[Finding]:
    """Per token count at the decode shape: which prefetching path hides its
    lookup best (and where), which hides nothing, how much the side-stream
    lookup slows the main-stream compute, and the offload overhead."""
    out = []
    recs, shape = decode_steps(run)
    if not recs:
        return out
    axes = [a for a in step_config_axes(recs) if a != "prefetch"]
    shape_text = f" ({shape})" if shape else ""
    by_tokens: dict[float, list[dict[str, Any]]] = {}
    for r in recs:
        by_tokens.setdefault(r.num_tokens or 0.0, []).append(r)
    for tokens, rs in sorted(by_tokens.items()):
        where = f"At {int(tokens)} tokens{shape_text}"
        pre = [r for r in rs if r.get("prefetch") and r.overlap_efficiency is not None]
        by_path: dict[str, list[dict[str, Any]]] = {}
        for r in pre:
            by_path.setdefault(path_of(r), []).append(r)
        parts = []
        ranked = sorted(by_path.items(), key=lambda kv: -max(r.overlap_efficiency for r in kv[1]))
        for path, prs in ranked:
            best = max(prs, key=lambda r: (r.overlap_efficiency, r.compute_us or 0))
            eff = best.overlap_efficiency
            lookup = best.lookup_ms
            lk = f" of its {fmt(lookup)} ms lookup" if lookup is not None else ""
            if eff < HIDES_NOTHING:
                cases = "its 1 prefetch case" if len(prs) == 1 else f"all {len(prs)} prefetch cases"
                p = (f"{path} hides nothing{lk} (overlap efficiency below {HIDES_NOTHING:.0%} in "
                     f"{cases}, {_cu_range(prs)})")
            else:
                cfg = step_config_label(best, axes).split(", ", 1)[1:] if axes else []
                exposed = best.exposed_ms
                ex = ("" if exposed is None else f", exposed {fmt(exposed)} ms" if exposed >= 0
                      else f", exposed 0 ms (measured {fmt(exposed)})")
                p = (f"{path} hides at best {eff * 100:.0f}%{lk} at compute_us = {fmt(best.get('compute_us'))}"
                     + (f" ({cfg[0]})" if cfg else "") + ex)
            slow = _slowdowns(prs)
            if slow:
                p += f"; it slows the main-stream compute by {_range_pct(slow)}"
                base = _slowdowns([r for r in rs if path_of(r) == path and not r.get("prefetch")])
                if base:
                    p += f" (without prefetch {_range_pct(base)})"
            parts.append(p)
        if parts:
            out.append(Finding("overlap", f"{where}, with prefetch: " + "; ".join(parts) + ".",
                               group="overlap"))
        overhead: dict[str, list[float]] = {}
        for r in rs:
            if r.offload_overhead is not None:
                overhead.setdefault(path_of(r), []).append(r.offload_overhead * 100)
        if overhead:
            ov = "; ".join(f"{path} {_range_pct(v)} ({len(v)} case{'s' if len(v) != 1 else ''})"
                           for path, v in sorted(overhead.items()))
            out.append(Finding("overlap", f"{where}: step time vs the resident step a server would run instead "
                                          f"(ids on the device, its best graph mode, the same timer) — {ov}.",
                               group="overlap"))
    return out


def _slowdowns(rs: Sequence[dict[str, Any]]) -> list[float]:
    """compute_slowdown in % where there is compute to slow (compute_us > 0)."""
    return [r.compute_slowdown * 100 for r in rs
            if r.compute_slowdown is not None and (r.compute_us or 0) > 0]


def _speed_words(time_ratios: Sequence[float]) -> str:
    """Time ratios (path / reference) as plain speed words."""
    lo, hi = min(time_ratios), max(time_ratios)
    tol = 1 + EFFECT_PCT / 100

    def span(a: float, b: float) -> str:
        return f"{a:.2f}×" if abs(a - b) < 0.005 else f"{a:.2f}–{b:.2f}×"

    if lo >= 1 / tol and hi <= tol:
        return f"the same speed within {EFFECT_PCT:.0f}%"
    if lo >= 1:
        return span(lo, hi) + " slower" + (f" (partly within {EFFECT_PCT:.0f}%)" if lo <= tol else "")
    if hi <= 1:
        return span(1 / hi, 1 / lo) + " faster" + (f" (partly within {EFFECT_PCT:.0f}%)" if hi >= 1 / tol else "")
    return f"between {1 / lo:.2f}× faster and {hi:.2f}× slower (mixed)"


def path_ranking_findings(run: Run) -> list[Finding]:
    """One finding per workload measured on several paths: the fastest and how
    the others compare (time ratio to the fastest)."""
    out = []
    for g in path_groups(run, min_paths=3):  # two-path workloads: see path_vs_reference_findings
        best = g.fastest
        t0 = best.median_ms
        ceil = []
        if pct_of_ceiling(best) is not None:
            ceil.append(f"{pct_of_ceiling(best):.0f}% of {best.get('ceiling')}"
                        + (": that ceiling does not bind this path, it is wrong for it" if _exceeded(best) else ""))
        head = (f"{g.label}: fastest {path_of(best)}, {fmt(t0)} ms, {fmt(best.get('gbps'))} GB/s"
                + (f" ({', '.join(ceil)})" if ceil else ""))
        rest = [f"{path_of(r)} {r.median_ms / t0:.2f}×" for r in g.records[1:]]
        out.append(Finding("lookup paths", head + "; then (× its time) " + ", ".join(rest) + ".",
                           group="paths"))
    return out


def path_vs_reference_findings(run: Run) -> list[Finding]:
    """Each path against the default pinned path (pinned_uva · triton_reference)
    on the same workloads, by token count."""
    out = []
    ratios: dict[str, dict[tuple, list[float]]] = {}
    for g in path_groups(run):
        ref = g.reference
        if ref is None:
            continue
        for r in g.records:
            if r is ref:
                continue
            tokens = (r.num_tokens or 0.0, r.num_heads or 1.0)
            ratios.setdefault(path_of(r), {}).setdefault(tokens, []).append(
                r.median_ms / ref.median_ms)
    for path, by_tokens in sorted(ratios.items()):
        parts = []
        for (tokens, heads), rs in sorted(by_tokens.items()):
            t = f"{int(tokens)} tokens" + (f" × {int(heads)} heads" if heads > 1 else "")
            parts.append(f"at {t} {_speed_words(rs)} ({len(rs)} workload{'s' if len(rs) != 1 else ''})")
        out.append(Finding("lookup paths", f"{path} vs {REFERENCE_PATH} on the same workloads: "
                           + "; ".join(parts) + ".", group="paths"))
    return out


def hot_cache_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in _lookups(run) if int(r.cache_rows or 0) > 0 and r.gbps is not None]
    if not recs:
        return out
    rates = [(r, hit_rate(r)) for r in recs]
    recorded = [(r, h) for r, h in rates if h is not None]
    best = max(recs, key=lambda r: r.gbps)
    text = f"{path_of(best)} (cache of {fmt(int(best.cache_rows))} rows)"
    if recorded:
        hs = [h * 100 for _, h in recorded]
        span = f"{hs[0]:.0f}%" if max(hs) - min(hs) < 0.5 else f"{min(hs):.0f}%–{max(hs):.0f}%"
        text += f": hit rate {span} over {len(hs)} lookup case{'s' if len(hs) != 1 else ''}"
    else:
        text += ": hit rate not recorded in this run"
    text += f"; best {fmt(best['gbps'])} GB/s at {workload_label(best)}"
    pct = pct_of_ceiling(best)
    if pct is not None:
        text += f", {pct:.0f}% of its {best.get('ceiling')} ceiling"
        if pct > CEILING_SLACK_PCT:
            text += (" — that ceiling is wrong for a cached path: most rows came from the GPU-resident cache, "
                     "not across the host link it measures")
    rows = best.rows or ((best.num_tokens or 0) * (best.num_heads or 1))
    if not recorded and rows and best.cache_rows >= rows:
        text += (f". The cache can hold every one of the {fmt(int(rows))} ids looked up: if it was warmed on "
                 f"them this is an all-hit best case, not what a cache this size gives on a real id stream")
    out.append(Finding("hot cache", text + ".", "warn" if not recorded else "info", group="paths"))
    return out


def ids_findings(run: Run) -> list[Finding]:
    """Skewed (zipf, ngram) ids vs uniform ids, matched cases, per path and token count."""
    out = []
    recs = _lookups(run)
    by_path: dict[tuple[str, str], dict[tuple, list[tuple[str, float]]]] = {}
    for g in pairs([r for r in recs if r.median_ms], "ids"):
        if "uniform" not in g:
            continue
        base = g["uniform"]
        for ids, r in g.items():
            if ids == "uniform":
                continue
            tokens = (r.num_tokens or 0.0, r.num_heads or 1.0)
            by_path.setdefault((path_of(r), str(ids)), {}).setdefault(tokens, []).append(
                (fmt_bytes(r.get("table_bytes")), r.median_ms / base.median_ms))
    for (path, ids), by_tokens in sorted(by_path.items()):
        parts = []
        for (tokens, heads), rows in sorted(by_tokens.items()):
            tables = ", ".join(dict.fromkeys(t for t, _ in rows if t))
            t = f"{int(tokens)} tokens" + (f" × {int(heads)} heads" if heads > 1 else "")
            parts.append(f"at {t} {_speed_words([x for _, x in rows])}" + (f" ({tables} tables)" if tables else ""))
        out.append(Finding("ids", f"{path}: {ids} ids vs uniform — " + "; ".join(parts) + ".", group="paths"))
    return out


def topology_findings(run: Run) -> list[Finding]:
    out = []
    recs = [r for r in run.ok if r.median_ms is not None]
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
                r.median_ms / base.median_ms)
            for key in ("gather_ms", "reduce_ms", "rank_spread_ms"):
                if getattr(r, key) is not None:
                    extras.setdefault(impl, {}).setdefault(label, {}).setdefault(key, []).append(getattr(r, key))
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
    recs = [r for r in _lookups(run) if r.median_ms]
    by_impl: dict[str, dict[str, list[float]]] = {}
    for r in recs:
        for key in ("graph_median_ms", "hot_median_ms"):
            if getattr(r, key) is not None:
                # a graph replay is like for like with the eager figure only when it rotated the same
                # id sets with the L2 flushed (older records replayed one set, warm)
                like = key != "graph_median_ms" or (bool(r.get("graph_cold_l2")) == bool(r.get("cold_l2", True))
                                                    and (r.graph_id_sets or 1) == (r.id_sets or 1))
                name = key if like else "graph_warm_one_set"
                by_impl.setdefault(str(r.get("impl")), {}).setdefault(name, []).append(
                    getattr(r, key) / r.median_ms)
    for impl, d in sorted(by_impl.items()):
        parts = []
        if "graph_median_ms" in d:
            parts.append(f"CUDA-graph replay of the lookup takes {statistics.median(d['graph_median_ms']) * 100:.0f}% "
                         f"of the eager time (same id sets, same L2 state)")
        if "graph_warm_one_set" in d:
            parts.append(f"a CUDA-graph replay of one repeated id set, warm, takes "
                         f"{statistics.median(d['graph_warm_one_set']) * 100:.0f}% of the cold eager time "
                         f"(not like for like: older records)")
        if "hot_median_ms" in d:
            parts.append(f"a warm-L2 lookup takes {statistics.median(d['hot_median_ms']) * 100:.0f}% of the cold one")
        n = max(len(v) for v in d.values())
        out.append(Finding("graphs/cache", f"{impl}: " + "; ".join(parts) + f" (median over {n} cases)."))
    return out


def offload_answer_findings(run: Run) -> list[Finding]:
    """The answer (:func:`ple_bench.report.verdict.verdicts`: per table, compute, id distribution
    and token count, the best stable pinned step against the resident step a server would run
    instead, its ratio's 95 % interval and the verdict read off it), as every screen prints it."""
    entries = verdicts(run.records)
    if not entries:
        return []
    lines = verdict_lines(entries)
    return [Finding("answer", lines[0] + " " + " ".join(line.strip() for line in lines[1:]), group="overlap")]


def noise_findings(run: Run) -> list[Finding]:
    out = []
    noisy = [r for r in run.ok if (r.cv or 0) > NOISY_CV]
    if noisy:
        worst = max(noisy, key=lambda r: r.cv)
        out.append(Finding("noise", f"{len(noisy)} case{'s' if len(noisy) != 1 else ''} had a coefficient of "
                           f"variation above {NOISY_CV:.0%} (worst {worst.cv:.0%}, {worst.get('case_id')}); "
                           f"treat their numbers with care.", "warn"))
    throttled = [r for r in run.ok if (r.throttled_samples or 0) > 0]
    if throttled:
        total = sum(int(r.throttled_samples) for r in throttled)
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
    out += offload_answer_findings(run)
    if not run.ceilings and any(r.gbps for r in run.ok):
        out.append(Finding("ceiling", "No bandwidth ceilings were measured on this run, so GB/s cannot be put "
                                      "against what the hardware can do."))
    for fn in (ceiling_findings, dtype_findings, topology_findings, graph_and_cache_findings,
               path_ranking_findings, path_vs_reference_findings, table_size_findings, ids_findings,
               hot_cache_findings, overlap_findings, prefetch_findings, noise_findings):
        out += fn(run)
    return out


__all__ = ["Finding", "GROUP_TITLES", "findings", "pct_of_ceiling"]


#: the topics a reader needs first, in order (the answer, then what binds it, then the rest)
TOPIC_RANK = ("answer", "status", "ceiling", "overlap", "prefetch", "path", "paths", "table size", "ids", "topology",
              "hot cache", "graph", "dtype", "noise")
MAX_KEY_FINDINGS = 10


def key_findings(found: list[Finding], limit: int = MAX_KEY_FINDINGS) -> list[Finding]:
    """The findings condensed for the top of the page: warnings first, then by topic rank, at most
    ``limit`` lines (the verdict, shown above them, is left out)."""
    rank = {t: i for i, t in enumerate(TOPIC_RANK)}
    ordered = sorted((f for f in found if f.topic != "answer"),
                     key=lambda f: (f.level != "warn", rank.get(f.topic, len(rank))))
    return ordered[:limit]
