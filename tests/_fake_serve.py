"""Synthetic serving runs for the serving answer's tests: ``kind = "serve"`` records (and, for the
predicted path, decoder-step records) written with meta.json through the real
:class:`ple_bench.results.RunWriter` (via :func:`tests._fake_runs.write_run`).

Step times follow a known law, ``fixed + (weights + batch × context × KV per token) / rate`` plus a
host placement's extra, times a seeded per-step factor (``noise``), so a test knows what a fit
should find; the largest batch of each placement is the capacity rule's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ple_bench.advise.serving import ServingAsk, served_capacity
from ple_bench.serving.capacity import batch_at as serve_batch
from ple_bench.serving.models import get_model
from tests._fake_runs import gpu_meta, stats_fields, write_run

GIB = 1 << 30
TABLE_47_7 = int(47.7 * GIB)
H200_BYTES = 150_110_011_392  # 139.8 GiB, as torch reports an H200
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def law_step_ms(model_name: str, batch: int, context: int, kv_dtype: str = "bf16", *, fixed_ms: float = 0.3,
                rate_gbps: float = 4000.0, extra_ms: float = 0.0, per_seq_ms: float = 0.0) -> float:
    m = get_model(model_name)
    nbytes = m.weight_bytes() + batch * context * m.kv_bytes_per_token(kv_dtype)
    return fixed_ms + nbytes / (rate_gbps * 1e6) + batch * per_seq_ms + extra_ms


def serve_records(*, model: str = "qwen3-8b", contexts: Iterable[int] = (2048, 8192, 32768),
                  placements: Iterable[str] = ("host", "hbm"), kv_dtype: str = "bf16", hbm_bytes: int = H200_BYTES,
                  table_bytes: int = TABLE_47_7, dim: int = 160, dtype: str = "fp8", heads: int = 16,
                  fixed_ms: float = 0.3, rate_gbps: float = 4000.0, host_extra_ms: float = 0.01,
                  per_seq_ms: float = 0.0,
                  noise: float = 0.0, mode: str = "gpu", seed: int = 0,
                  steps: dict[tuple[str, int, int], float] | None = None) -> list[dict[str, Any]]:
    """Serve records at the suite's fractions of each placement's largest batch, as the serve executor
    writes them (``tokens_per_s`` and ``tpot_ms`` are derived by ``record.derive`` when written:
    :func:`write_serve_run`); ``steps`` overrides the step time of (placement, context, batch)."""
    rng = np.random.default_rng(seed)
    m = get_model(model)
    out = []
    for ctx in contexts:
        for placement in placements:
            ask = ServingAsk(m, ctx, kv_dtype, table_bytes, dim, dtype, heads)
            cap = served_capacity(ask, placement, hbm_bytes, None)  # the serving suite's rule
            base = {"kind": "serve", "placement": placement, "model": model, "context_len": ctx,
                    "kv_dtype": kv_dtype, "gpu_memory_utilization": 0.90, "max_batch": cap.max_batch,
                    "impl": "pinned_host_flag" if placement == "host" else "device", "table_bytes": table_bytes,
                    "dim": dim, "dtype": dtype, "num_heads": heads, "mode": mode, "timer": "cuda_event",
                    "kv_source": "measured", "etp": 1, "hbm_bytes_total": hbm_bytes,
                    "capacity_rule": cap.explain()}
            if cap.max_batch < 1:
                out.append({**base, "case_id": f"serve-{model}-{placement}-c{ctx}", "status": "skipped",
                            "reason": f"no sequence fits: {cap.explain()}"})
                continue
            for frac in FRACTIONS:
                batch = serve_batch(cap, frac)
                step = (steps or {}).get((placement, ctx, batch))
                if step is None:
                    step = law_step_ms(model, batch, ctx, kv_dtype, fixed_ms=fixed_ms, rate_gbps=rate_gbps,
                                       extra_ms=host_extra_ms if placement == "host" else 0.0, per_seq_ms=per_seq_ms)
                    step *= float(rng.normal(1.0, noise)) if noise else 1.0
                samples = [step * (1 + 0.002 * (i % 5 - 2)) for i in range(20)]
                rec = {**base, "case_id": f"serve-{model}-{placement}-c{ctx}-f{frac:g}", "status": "ok",
                       "reason": "", "serve_batch": batch, "batch_fraction": frac, **stats_fields(samples)}
                rec.update(step_ms=rec["median_ms"], kv_bytes=batch * m.kv_bytes_per_seq(ctx, kv_dtype))
                out.append(rec)
    return out


def write_serve_run(results_dir: str | Path, run_id: str = "2026-12-02T10-00-00-serve", *,
                    records: list[dict[str, Any]] | None = None, hbm_bytes: int = H200_BYTES,
                    hbm_read_gbps: float | None = 4400.0, mode: str = "gpu", host_memory_bytes: int | None = None,
                    **kw: Any) -> Path:
    """A run folder (records.jsonl + meta.json) of serve records (``records``, or :func:`serve_records`)."""
    recs = records if records is not None else serve_records(hbm_bytes=hbm_bytes, mode=mode, **kw)
    meta = gpu_meta(run_id, suite="serving", mode=mode)
    meta["device"] = dict(meta["device"], memory_bytes=hbm_bytes)
    if host_memory_bytes:
        meta["device"]["host_memory_bytes"] = host_memory_bytes
    if hbm_read_gbps:
        meta["ceilings"]["hbm_read_gbps"] = hbm_read_gbps
    return write_run(results_dir, run_id, meta, recs)


def write_decoder_run(results_dir: str | Path, run_id: str = "2026-12-01T10-00-00-decoder", *,
                      model: str = "qwen3-8b", fixed_ms: float = 0.3, rate_gbps: float = 4000.0,
                      hbm_read_gbps: float = 4400.0, exposed: dict[str, float] | None = None) -> Path:
    """A run of decode steps over decoder layers (no serve records): ``compute_ms`` =
    fixed + ``compute_bytes`` / rate, and each path's ``exposed_ms``."""
    m = get_model(model)
    exposed = exposed if exposed is not None else {"device": 0.004, "pinned_host_flag": 0.006}
    recs = []
    for ctx in (2048, 8192):
        for batch in (64, 256):
            nbytes = m.weight_bytes() + batch * ctx * m.kv_bytes_per_token("bf16")
            compute = fixed_ms + nbytes / (rate_gbps * 1e6)
            for impl, e in exposed.items():
                samples = [compute + e] * 10
                recs.append({"kind": "step", "case_id": f"step-{impl}-c{ctx}-t{batch}", "status": "ok", "reason": "",
                             "impl": impl, "num_tokens": batch, "dim": 160, "dtype": "fp8", "num_heads": 16,
                             "compute": "decoder", "context_len": ctx, "mode": "gpu", "timer": "cuda_event",
                             "compute_bytes": nbytes, "compute_ms": compute, "exposed_ms": e,
                             "step_ms": compute + e, "prefetch": True, "ids_on": "device",
                             **stats_fields(samples)})
    meta = gpu_meta(run_id, suite="decoder")
    meta["ceilings"]["hbm_read_gbps"] = hbm_read_gbps
    return write_run(results_dir, run_id, meta, recs)
