"""Realistic fake run directories for report / compare / export tests.

They are written through the real :class:`ple_bench.results.RunWriter` and
:class:`ple_bench.spec.case.Case`, so they have exactly the stored schema.  Timings
come from a simple bandwidth model (latency + bytes / bandwidth, with an L2
effect for small device tables and a row-size effect) plus seeded log-normal
noise, so that plots and findings have real shapes to show.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ple_bench import record
from ple_bench.spec.case import Case
from ple_bench.results import RunWriter

CEILINGS = {"h2d_gbps": 55.2, "d2h_gbps": 55.1, "d2d_gbps": 4186.0, "pinned_random_row_gbps": 50.5,
            "pinned_random_row_gbps_160B": 40.0, "pinned_random_row_gbps_512B": 50.5,
            "device_random_row_gbps": 800.0, "device_random_row_gbps_160B": 420.0,
            "device_random_row_gbps_512B": 800.0}
GPU_DEVICE = {"name": "NVIDIA H200", "driver": "580.95.05", "cuda": "13.0", "memory_bytes": 150_000_000_000,
              "sm_count": 132, "l2_bytes": 62_914_560}


def gpu_meta(run_id: str, suite: str = "nightly", started_at: str = "2026-11-30T02:00:00+00:00",
             **overrides: Any) -> dict[str, Any]:
    meta = {
        "run_id": run_id, "suite": suite, "device": dict(GPU_DEVICE), "torch": "2.11.0+cu130",
        "triton": "3.6.0", "python": "3.12.3", "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "host": {"hostname": "h200-node-1", "cpu_count": 16, "platform": "Linux-6.8-x86_64"},
        # Besides GB/s ceilings the runner stores a few other facts here (not ceilings).
        "ceilings": dict(CEILINGS, ceilings_seconds=3.1, ceilings_timer="cuda_event",
                         pinned_random_row_rows_per_s=1.9e8),
        "mode": "gpu", "timer": "cuda_event",
        "started_at": started_at, "ended_at": started_at.replace("02:00", "02:40"),
        "argv": ["python", "-m", "ple_bench", "run", "--suite", suite], "status": "complete",
    }
    meta.update(overrides)
    return meta


def stats_fields(samples: list[float]) -> dict[str, Any]:
    arr = np.asarray(samples, dtype=float)
    q1, q3 = np.percentile(arr, [25, 75])
    return {
        "samples_ms": [float(v) for v in arr], "n_samples": int(arr.size),
        "median_ms": float(np.median(arr)), "mean_ms": float(arr.mean()), "min_ms": float(arr.min()),
        "max_ms": float(arr.max()), "p10_ms": float(np.percentile(arr, 10)),
        "p90_ms": float(np.percentile(arr, 90)), "iqr_ms": float(q3 - q1),
        "cv": float(arr.std(ddof=1) / arr.mean()) if arr.size > 1 else 0.0,
    }


def noisy(rng: np.random.Generator, center_ms: float, n: int, cv: float) -> list[float]:
    sigma = math.sqrt(math.log(1 + cv * cv))
    return list(center_ms * rng.lognormal(-sigma * sigma / 2, sigma, size=n))


def model_lookup_ms(case: Case) -> tuple[float, str]:
    """(ideal median ms, binding ceiling name) of a lookup under a toy model."""
    rows = case.num_tokens * case.num_heads
    nbytes = rows * case.row_bytes
    row_eff = min(1.0, case.row_bytes / 512) ** 0.5
    if case.impl == "device":
        l2 = case.table_bytes < GPU_DEVICE["l2_bytes"]
        bw = CEILINGS["device_random_row_gbps_512B"] * (0.9 if l2 else 0.5) * row_eff
        lat_ms, ceiling = 0.006, "device_random_row_gbps"
    else:
        size_eff = 0.9 if case.table_bytes < (1 << 30) else 0.75
        bw = CEILINGS["pinned_random_row_gbps_512B"] * size_eff * row_eff
        lat_ms, ceiling = 0.012, "pinned_random_row_gbps"
    topo = 1.0 + 0.35 * (case.etp - 1) + 0.15 * (case.dp - 1)
    return (lat_ms + nbytes / (bw * 1e9) * 1e3) * topo, ceiling


def lookup_record(case: Case, samples: list[float], ceiling: str | None, ceilings: dict[str, float],
                  mode: str = "gpu", timer: str = "cuda_event", **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"case_id": case.case_id, "status": "ok", "reason": "", **case.axes()}
    rec.update(stats_fields(samples))
    rows = case.num_tokens * case.num_heads * case.dp
    nbytes = rows * case.row_bytes
    rec.update({
        "timer": timer, "mode": mode, "rows": rows, "bytes_moved": nbytes,
        "row_bytes": case.row_bytes, "table_bytes": case.table_bytes,
        "hot_median_ms": rec["median_ms"] * 0.8, "graph_median_ms": rec["median_ms"] * 0.9,
        "sm_clock_mhz": 1980 if mode == "gpu" else None, "throttled_samples": 0,
    })
    rec.update(extra)
    return rec


def not_measured(case: Case, status: str, reason: str) -> dict[str, Any]:
    return {"case_id": case.case_id, "status": status, "reason": reason, **case.axes(),
            "row_bytes": case.row_bytes, "table_bytes": case.table_bytes}


def write_run(results_dir: str | Path, run_id: str, meta: dict[str, Any],
              records: Iterable[dict[str, Any]], *, derive: bool = True) -> Path:
    """Writes the records as the runner does: derived figures by ``record.derive``
    (``derive=False``: as given, i.e. an old-schema run without ``schema_version``)."""
    records = list(records)
    if derive:
        peers = record.Peers.of(records)
        for rec in records:
            record.derive(rec, meta.get("ceilings") or {}, peers)
    writer = RunWriter(Path(results_dir) / run_id)
    writer.write_meta(meta)
    for rec in records:
        writer.append(rec)
    return writer.run_dir


def gpu_cases() -> dict[str, list[Case]]:
    """The fake GPU suite: single-GPU lookups, dim sweep, decode steps, multi-rank, broken ones."""
    lookups = [
        Case(impl=impl, dtype=dtype, dim=160, vocab_size=vocab, num_heads=16, num_tokens=tokens)
        for impl in ("device", "pinned_uva") for dtype in ("bf16", "fp8")
        for vocab in (1 << 14, 1 << 20, 1 << 24) for tokens in (64, 1024)
    ]
    lookups += [
        Case(impl=impl, dtype=dtype, dim=dim, vocab_size=1 << 20, num_heads=16, num_tokens=1024)
        for impl in ("device", "pinned_uva") for dtype in ("bf16", "fp8") for dim in (64, 512)
    ]
    steps = [
        Case(kind="step", impl=impl, dtype="fp8", dim=160, vocab_size=1 << 24, num_heads=16,
             num_tokens=256, prefetch=prefetch, compute_us=compute_us)
        for impl, prefetch in (("device", False), ("pinned_uva", False), ("pinned_uva", True))
        for compute_us in (0.0, 50.0, 200.0, 1000.0)
    ]
    multirank = [
        Case(impl=impl, dtype="fp8", dim=160, vocab_size=1 << 20, num_heads=16, num_tokens=1024,
             tp=tp, etp=etp, dp=dp)
        for impl in ("device", "pinned_uva") for tp, etp, dp in ((1, 2, 2), (2, 2, 1))
    ]
    broken = {
        "skipped": Case(impl="device", dtype="fp8", dim=160, vocab_size=1 << 20, tp=4, etp=4,
                        num_tokens=1024, num_heads=16),
        "failed": Case(impl="device", dtype="fp32", dim=4096, vocab_size=1 << 30),
        "invalid": Case(impl="pinned_uva", dtype="fp8", dim=160, vocab_size=1 << 20, graph="breakable"),
    }
    return {"lookup": lookups, "step": steps, "multirank": multirank, "broken": list(broken.values())}


BROKEN_REASONS = {
    "skipped": "needs 4 GPUs (tp=4, dp=1); this machine has 1",
    "failed": "RuntimeError: CUDA out of memory. Tried to allocate 16.00 GiB <bad & 'quoted'>",
    "invalid": "lookup mismatch: 3 of 4096 rows differ from the synthetic reference (first at id 17)",
}


def write_gpu_run(results_dir: str | Path, run_id: str = "20261130-020000-nightly-a1b2", *,
                  seed: int = 0, n_samples: int = 30, noise_cv: float = 0.02,
                  factor: Callable[[Case], float] | None = None, suite: str = "nightly",
                  started_at: str = "2026-11-30T02:00:00+00:00", include_broken: bool = True,
                  only: Callable[[Case], bool] | None = None) -> Path:
    """A complete fake GPU run.  ``factor(case)`` scales a case's true time
    (e.g. 1.2 plants a 20% regression); ``only`` keeps a subset of cases."""
    rng = np.random.default_rng(seed)
    factor = factor or (lambda case: 1.0)
    keep = only or (lambda case: True)
    cases = gpu_cases()
    records: list[dict[str, Any]] = []
    for case in cases["lookup"] + cases["multirank"]:
        if not keep(case):
            continue
        center, ceiling = model_lookup_ms(case)
        samples = noisy(rng, center * factor(case), n_samples, noise_cv)
        extra: dict[str, Any] = {}
        if case.world_size > 1 or case.etp > 1:
            extra = {"gather_ms": 0.004 * (case.dp > 1) + 0.001, "reduce_ms": 0.018 * case.etp,
                     "rank_spread_ms": 0.002 * case.world_size}
        records.append(lookup_record(case, samples, ceiling, CEILINGS, **extra))
    device_step: dict[float, float] = {}
    for case in cases["step"]:
        if not keep(case):
            continue
        lookup_ms, _ = model_lookup_ms(Case(impl=case.impl, dtype=case.dtype, dim=case.dim,
                                            vocab_size=case.vocab_size, num_heads=case.num_heads,
                                            num_tokens=case.num_tokens))
        slowdown = (0.04 if case.prefetch else 0.0) if case.compute_us else None
        compute_ms = case.compute_us / 1e3 * (1 + (slowdown or 0.0))
        exposed = max(0.0, lookup_ms - compute_ms) + 0.003 if case.prefetch else lookup_ms
        step_ms = (compute_ms + exposed + 0.004) * factor(case)
        samples = noisy(rng, step_ms, n_samples, noise_cv)
        rec = lookup_record(case, samples, None, CEILINGS)
        med = rec["median_ms"]
        if case.impl == "device":
            device_step[case.compute_us] = med
        rec.update({
            "step_ms": med, "lookup_ms": lookup_ms, "compute_ms": compute_ms, "exposed_ms": exposed,
            "compute_slowdown": slowdown,
            "offload_overhead": (med / device_step[case.compute_us] - 1.0) if case.impl != "device"
            and case.compute_us in device_step else None,
            "step_samples_ms": samples, "exposed_samples_ms": noisy(rng, exposed, n_samples, noise_cv),
        })
        records.append(rec)
    if include_broken:
        for status, case in zip(("skipped", "failed", "invalid"), cases["broken"]):
            if keep(case):
                records.append(not_measured(case, status, BROKEN_REASONS[status]))
    return write_run(results_dir, run_id, gpu_meta(run_id, suite=suite, started_at=started_at), records)


def write_cpu_run(results_dir: str | Path, run_id: str = "20261130-101500-smoke-c0de", *,
                  seed: int = 1) -> Path:
    """A fake CPU functional run: host timer, no ceilings, pinned backend skipped."""
    rng = np.random.default_rng(seed)
    meta = {
        "run_id": run_id, "suite": "smoke", "device": {"name": "cpu"}, "torch": "2.13.0+cpu",
        "triton": "3.9.0", "python": "3.11.9", "git_commit": None, "host": "ci-runner",
        "ceilings": {}, "mode": "functional", "timer": "host_monotonic",
        "started_at": "2026-11-30T10:15:00+00:00", "ended_at": None, "status": "complete",
    }
    records = []
    for dtype in ("bf16", "fp8"):
        for tokens in (16, 64):
            case = Case(impl="device", dtype=dtype, dim=64, vocab_size=4096, num_tokens=tokens)
            samples = noisy(rng, 0.4 + tokens * 0.01, 5, 0.1)
            rec = lookup_record(case, samples, None, {}, mode="functional", timer="host_monotonic")
            rec.update({"hot_median_ms": None, "graph_median_ms": None})
            records.append(rec)
    step = Case(kind="step", impl="device", dtype="bf16", dim=64, vocab_size=4096, num_tokens=16,
                compute_us=100.0)
    srec = lookup_record(step, noisy(rng, 1.5, 5, 0.1), None, {}, mode="functional", timer="host_monotonic")
    srec.update({"step_ms": srec["median_ms"], "exposed_ms": None})
    records.append(srec)
    records.append(not_measured(Case(impl="pinned_uva", dtype="fp8", dim=64, vocab_size=4096),
                                "skipped", "pinned_uva needs CUDA (UVA); functional CPU run"))
    records.append(not_measured(Case(impl="device", graph="full", dim=64, vocab_size=4096),
                                "skipped", "CUDA graphs need a GPU"))
    return write_run(results_dir, run_id, meta, records)


def median(values: list[float]) -> float:
    return statistics.median(values)


# ------------------------------------------------------------ lookup paths and overlap

def _planted_lookup(case: Case, median_ms: float, rng: np.random.Generator, **extra: Any) -> dict[str, Any]:
    ceiling = "device_random_row_gbps" if case.impl == "device" else "pinned_random_row_gbps"
    return lookup_record(case, noisy(rng, median_ms, 20, 0.005), ceiling, CEILINGS, **extra)


def write_paths_run(results_dir: str | Path, run_id: str = "20261130-030000-paths-p1a7", *,
                    seed: int = 3) -> Path:
    """Planted lookup-path and decode-step data with known answers:

    * fp8 dim 160, 16 heads.  At 4096 tokens ``pinned_uva · triton_tuned`` takes half
      the time of the default ``pinned_uva`` kernel (triton_reference) at every table
      size; at 256 tokens the two are equal.  ``pinned_uva`` appears both with kernel ""
      and kernel "triton_reference" (the same path).
    * The default pinned path's GB/s at 4096 tokens falls 4x from 64 MiB to 16 GiB.
    * zipf:1.1 ids take half the uniform time on the default pinned path at 4096 tokens.
    * ``pinned_hot_cache`` records a hit rate of 0.37 in ``extra``.
    * Decode steps (each prefetch step with its prefetch-off twin): at 64 tokens the
      prefetching default pinned path hides 100% at compute_us = 400 and slows the compute
      by 2%; at 512 tokens it hides nothing (overlap 0) and slows the compute by 150%,
      without prefetch by 1%.
    """
    rng = np.random.default_rng(seed)
    records: list[dict[str, Any]] = []
    base = dict(dtype="fp8", dim=160, num_heads=16)
    sizes = {"64M": 419_430, "1G": 6_710_886, "16G": 107_374_182}
    ref_ms = {256: 0.026, 4096: {"64M": 0.30, "1G": 0.60, "16G": 1.20}}
    for name, vocab in sizes.items():
        for tokens in (256, 4096):
            t_ref = ref_ms[256] if tokens == 256 else ref_ms[4096][name]
            for kernel in ("", "triton_reference"):
                if kernel and name == "64M":
                    continue
                case = Case(impl="pinned_uva", kernel=kernel, vocab_size=vocab, num_tokens=tokens, **base)
                records.append(_planted_lookup(case, t_ref, rng))
            if name != "64M":
                tuned = Case(impl="pinned_uva", kernel="triton_tuned", vocab_size=vocab, num_tokens=tokens, **base)
                records.append(_planted_lookup(tuned, t_ref / 2 if tokens == 4096 else t_ref, rng))
                zipf = Case(impl="pinned_uva", ids="zipf:1.1", vocab_size=vocab, num_tokens=tokens, **base)
                records.append(_planted_lookup(zipf, t_ref / 2 if tokens == 4096 else t_ref, rng))
                dev = Case(impl="device", vocab_size=vocab, num_tokens=tokens, **base)
                records.append(_planted_lookup(dev, 0.02 + tokens * 2e-6, rng))
    hot = Case(impl="pinned_hot_cache", cache_rows=1 << 20, vocab_size=sizes["16G"], num_tokens=4096, **base)
    records.append(_planted_lookup(hot, 0.4, rng, extra={"hit_rate": 0.37}))

    def step(tokens: int, prefetch: bool, compute_us: float, lookup_ms: float, exposed_ms: float,
             slowdown: float, graph: str = "eager") -> dict[str, Any]:
        case = Case(kind="step", impl="pinned_uva", vocab_size=sizes["16G"], num_tokens=tokens, prefetch=prefetch,
                    compute_us=compute_us, graph=graph, **base)
        compute_ms = compute_us / 1e3 * (1 + slowdown)
        step_ms = compute_ms + exposed_ms + 0.004
        rec = lookup_record(case, noisy(rng, step_ms, 20, 0.005), None, CEILINGS)
        rec.update({"step_ms": rec["median_ms"], "lookup_ms": lookup_ms, "compute_ms": compute_ms,
                    "exposed_ms": exposed_ms, "compute_slowdown": slowdown})
        return rec

    # the prefetch-off twins come first, as the runner orders them
    for cu in (0.0, 50.0, 200.0, 400.0):
        records.append(step(64, False, cu, 0.0156, 0.0156, 0.0))
        records.append(step(512, False, cu, 0.215, 0.3, 0.01))
    for cu, exposed in ((0.0, 0.012), (50.0, 0.008), (200.0, 0.004), (400.0, 0.0)):
        records.append(step(64, True, cu, 0.0156, exposed, 0.02))
    for cu in (0.0, 50.0, 200.0, 400.0):
        records.append(step(512, True, cu, 0.215, 0.3, 1.5))
    return write_run(results_dir, run_id, gpu_meta(run_id, suite="paths"), records)


def derive_in_order(recs: list[dict]) -> list[dict]:
    """Derive ``recs`` as a run does, the resident steps first (each pinned step finds its baseline
    among the records derived before it)."""
    peers = record.Peers()
    out = []
    for r in sorted(recs, key=lambda r: r["impl"] != "device"):
        record.derive(r, {}, peers)
        peers.add(r)
        out.append(r)
    return out
