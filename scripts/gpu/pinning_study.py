"""Issue 15 study: what pinning a table costs, per host-allocation mode, from 64 MiB
up to the largest table that fits, and whether the mode changes any lookup rate.

For each size and mode (``torch``: ``torch.empty(pin_memory=True)``, a power-of-two
block; ``exact``: ``cudaHostRegister`` over an anonymous mapping of the page-rounded
bytes; ``exact_huge``: the same on 2 MiB transparent huge pages -- all through
:func:`ple_bench.backends.host_alloc.allocate_pinned`, the suite's own code):

* seconds to allocate + pin, to fill (:func:`ple_bench.backends.fill_synthetic`,
  the suite's fill) and to free, each also per GiB of table;
* bytes pinned, MemAvailable before, after allocation, after fill and after free;
* a correctness gate (rows read back equal the synthetic rows);
* the random-row rate through the UVA view (``cuda_view_of_pinned`` +
  ``torch.index_select``; uniform random 160 B rows; 4096 and 65 536 rows a call;
  8 id sets rotated; CUDA events; median of the calls);
* the host-gather rate (``torch.index_select`` on the host table into a pinned
  staging buffer, the CPU-gather path's core; host timer).

Sizes above what fits (``host_alloc.host_fit``, the suite's check) are skipped with
the numbers; ``max`` is the largest whole GiB that fits in exact mode right now.
torch mode stops at ``--torch-max`` (default 32 GiB: above that it pins up to 2x).

    PYTHONPATH=. python3 scripts/gpu/pinning_study.py --out docs/gpu-logs/pinning_study.json
    PYTHONPATH=. python3 scripts/gpu/pinning_study.py --sizes 64MiB,1GiB --modes exact --out /tmp/p.json
    PYTHONPATH=. python3 scripts/gpu/pinning_study.py --dry-run --out /tmp/p.json   # CPU, tiny sizes

About 2-3 minutes on one H200 with 125 GiB of host memory (default sizes).  ``--dry-run``
runs the same code on the CPU (functional mode: nothing pinned, host timer) on tiny tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ple_bench.backends import fill_synthetic, synthetic_rows  # noqa: E402
from ple_bench.backends import host_alloc  # noqa: E402
from ple_bench.backends.uva import cuda_view_of_pinned  # noqa: E402
from ple_bench.case import HOST_ALLOC_MODES  # noqa: E402
from ple_bench.suite import _Bad, human_bytes, parse_size  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
ROW_BYTES = 160  # Qwen4Exp's fp8 row
QWEN_ROWS = 320_001_536  # the 47.7 GiB table
DEFAULT_SIZES = f"64MiB,1GiB,8GiB,32GiB,{QWEN_ROWS * ROW_BYTES},100GiB,max"
DRY_SIZES = "256KiB,3MiB"
ROW_COUNTS = (4096, 65536)
ID_SETS = 8
SEED = 1234


def parse_sizes(text: str, max_bytes: int) -> list[int]:
    out: list[int] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            n = max_bytes if item == "max" else parse_size(item)
        except _Bad as exc:
            raise SystemExit(f"--sizes: {exc}") from None
        n = n // ROW_BYTES * ROW_BYTES
        if n >= ROW_BYTES and n not in out:
            out.append(n)
    return sorted(out)


def available_bytes() -> int:
    free = host_alloc.mem_available_bytes()
    return free if free is not None else 0


def largest_exact_fit(available: int) -> int:
    """The largest whole GiB (exact mode) that ``host_alloc.host_fit`` accepts now."""
    n = max(0, available - host_alloc.headroom_bytes(available)) // GiB * GiB
    while n > GiB and host_alloc.host_fit(n, 1, "exact", pinned=True, available=available):
        n -= GiB
    return n


def free_torch_cache() -> None:
    host_alloc.release_cached_pinned_blocks()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def uva_row_rate(table_u8: torch.Tensor, device: torch.device, rows: int, reps: int) -> dict[str, Any]:
    """Random rows read by the GPU through the UVA view (CPU in dry-run: a host gather)."""
    n_rows = table_u8.shape[0]
    view = cuda_view_of_pinned(table_u8, device) if device.type == "cuda" else table_u8
    gen = torch.Generator().manual_seed(SEED + rows)
    sets = [torch.randint(0, n_rows, (rows,), generator=gen).to(device) for _ in range(ID_SETS)]
    out = torch.empty(rows, table_u8.shape[1], dtype=torch.uint8, device=device)
    for ids in sets:  # warm-up, and every set once
        torch.index_select(view, 0, ids, out=out)
    _sync(device)
    times_ms = []
    for i in range(reps):
        ids = sets[i % ID_SETS]
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.index_select(view, 0, ids, out=out)
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            torch.index_select(view, 0, ids, out=out)
            times_ms.append((time.perf_counter() - t0) * 1e3)
    # gate: the last call's rows are the table's rows
    want = table_u8.index_select(0, sets[(reps - 1) % ID_SETS].cpu())
    ok = bool(torch.equal(out.cpu(), want))
    return _rate(rows, times_ms, ok, "cuda_events" if device.type == "cuda" else "host_perf_counter")


def host_gather_rate(table_u8: torch.Tensor, pinned: bool, rows: int, reps: int) -> dict[str, Any]:
    """Random rows gathered by the host's cores into a (pinned) staging buffer."""
    n_rows = table_u8.shape[0]
    gen = torch.Generator().manual_seed(SEED + 7 * rows)
    sets = [torch.randint(0, n_rows, (rows,), generator=gen) for _ in range(ID_SETS)]
    staging = torch.empty(rows, table_u8.shape[1], dtype=torch.uint8, pin_memory=pinned)
    for ids in sets:
        torch.index_select(table_u8, 0, ids, out=staging)
    times_ms = []
    for i in range(reps):
        t0 = time.perf_counter()
        torch.index_select(table_u8, 0, sets[i % ID_SETS], out=staging)
        times_ms.append((time.perf_counter() - t0) * 1e3)
    ok = bool(torch.equal(staging, table_u8.index_select(0, sets[(reps - 1) % ID_SETS])))
    out = _rate(rows, times_ms, ok, "host_perf_counter")
    out["threads"] = torch.get_num_threads()
    return out


def _rate(rows: int, times_ms: list[float], ok: bool, timer: str) -> dict[str, Any]:
    med = statistics.median(times_ms)
    return {"rows": rows, "median_ms": med, "min_ms": min(times_ms), "n": len(times_ms),
            "rows_per_s": rows / (med / 1e3), "gbps": rows * ROW_BYTES / (med * 1e6), "gate": ok,
            "timer": timer}


def study_one(nbytes: int, mode: str, device: torch.device, reps: int) -> dict[str, Any]:
    """Allocate, fill, gate, measure and free one table of ``nbytes`` in ``mode``."""
    rows = nbytes // ROW_BYTES
    pinned = device.type == "cuda"
    rec: dict[str, Any] = {"size_bytes": rows * ROW_BYTES, "rows": rows, "mode": mode,
                           "needs_bytes": host_alloc.host_table_bytes(rows * ROW_BYTES, mode, pinned=pinned)}
    gc.collect()
    if pinned and mode != "torch":
        free_torch_cache()
    avail = available_bytes()
    reason = host_alloc.host_fit(rows * ROW_BYTES, 1, mode, pinned=pinned, available=avail)
    if reason is not None and pinned:
        free_torch_cache()
        avail = available_bytes()
        reason = host_alloc.host_fit(rows * ROW_BYTES, 1, mode, pinned=pinned, available=avail)
    rec["mem_available_before"] = avail
    if reason is not None:
        rec.update(status="skipped", reason=reason)
        return rec
    try:
        table, alloc = host_alloc.allocate_pinned(rows, ROW_BYTES, torch.float8_e4m3fn, mode, device)
    except (host_alloc.HostAllocUnavailable, RuntimeError, torch.OutOfMemoryError) as exc:
        rec.update(status="skipped", reason=f"{type(exc).__name__}: {exc}")
        return rec
    gib = rows * ROW_BYTES / GiB
    rec.update(pinned_bytes=alloc.pinned_bytes, host_bytes=alloc.host_bytes, alloc_s=alloc.alloc_s,
               alloc_s_per_gib=alloc.alloc_s / gib, from_cache=alloc.from_cache, note=alloc.note,
               mem_available_after_alloc=available_bytes())
    t0 = time.perf_counter()
    fill_synthetic(table, 0, SEED, work_device=device if pinned else None)
    rec["fill_s"] = time.perf_counter() - t0
    rec["fill_s_per_gib"] = rec["fill_s"] / gib
    rec["mem_available_after_fill"] = available_bytes()
    probe = torch.tensor([0, rows // 2, rows - 1], dtype=torch.int64)
    want = synthetic_rows(probe, ROW_BYTES, SEED, torch.float8_e4m3fn)
    rec["fill_gate"] = bool(torch.equal(table.index_select(0, probe).view(torch.uint8), want.view(torch.uint8)))
    table_u8 = table.view(torch.uint8)
    rec["uva"] = {str(n): uva_row_rate(table_u8, device, n, reps) for n in ROW_COUNTS}
    rec["host_gather"] = {str(n): host_gather_rate(table_u8, pinned, n, max(3, reps // 8)) for n in ROW_COUNTS}
    del table, table_u8
    gc.collect()
    t0 = time.perf_counter()
    alloc.close()
    if mode == "torch" and pinned:
        free_torch_cache()  # torch keeps the block otherwise: the free is part of its cost
    rec["free_s"] = time.perf_counter() - t0
    rec["mem_available_after_free"] = available_bytes()
    rec["status"] = "ok" if rec["fill_gate"] and all(
        r["gate"] for part in ("uva", "host_gather") for r in rec[part].values()) else "invalid"
    return rec


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "host": platform.node(), "cpus": os.cpu_count(),
                            "mem_available": host_alloc.mem_available_bytes(), "thp": host_alloc.thp_policy(),
                            "page_bytes": host_alloc.PAGE_BYTES}
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total"] = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("MemTotal:"))
    except (OSError, StopIteration):
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _fmt(rec: dict[str, Any]) -> str:
    size = f"{human_bytes(rec['size_bytes']):>9s}"
    if rec["status"] == "skipped":
        return f"{size} {rec['mode']:10s} SKIPPED: {rec['reason']}"
    uva = "  ".join(f"uva{n} {rec['uva'][n]['rows_per_s'] / 1e6:7.1f} Mrow/s" for n in rec["uva"])
    hg = "  ".join(f"host{n} {rec['host_gather'][n]['rows_per_s'] / 1e6:6.1f} Mrow/s" for n in rec["host_gather"])
    return (f"{size} {rec['mode']:10s} {rec['status']:7s} pinned {rec['pinned_bytes'] / GiB:7.2f} GiB  "
            f"alloc {rec['alloc_s']:7.2f} s ({rec['alloc_s_per_gib']:.3f} s/GiB)  "
            f"fill {rec['fill_s']:6.2f} s  free {rec['free_s']:6.2f} s  "
            f"MemAvailable {rec['mem_available_before'] / GiB:.1f} -> {rec['mem_available_after_fill'] / GiB:.1f} "
            f"-> {rec['mem_available_after_free'] / GiB:.1f} GiB  {uva}  {hg}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None, help=f"comma list, 'max' = largest exact fit (default {DEFAULT_SIZES})")
    ap.add_argument("--modes", default="torch,exact", help=f"comma list of {', '.join(HOST_ALLOC_MODES)}")
    ap.add_argument("--torch-max", default="32GiB", help="largest table measured in torch mode")
    ap.add_argument("--reps", type=int, default=40, help="timed lookups per row count")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny tables (functional mode, nothing pinned)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in HOST_ALLOC_MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; allowed: {', '.join(HOST_ALLOC_MODES)}")
    if args.dry_run or not torch.cuda.is_available():
        if not args.dry_run:
            ap.error("no CUDA GPU here: use --dry-run for the CPU (functional) run")
        device = torch.device("cpu")
        sizes = parse_sizes(args.sizes or DRY_SIZES, 4 * MiB)
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.init()
        free_torch_cache()
        sizes = parse_sizes(args.sizes or DEFAULT_SIZES, largest_exact_fit(available_bytes()))
    torch_max = parse_size(args.torch_max)
    started = time.perf_counter()
    report: dict[str, Any] = {"argv": sys.argv if argv is None else argv, "machine": machine(),
                              "device": str(device), "sizes": sizes, "modes": modes, "rows": []}
    print(f"machine: {report['machine']}")
    for nbytes in sizes:
        for mode in modes:
            if mode == "torch" and nbytes > torch_max:
                rec = {"size_bytes": nbytes, "rows": nbytes // ROW_BYTES, "mode": mode, "status": "skipped",
                       "reason": f"torch mode stops at --torch-max {args.torch_max} (it would pin "
                                 f"{host_alloc.host_table_bytes(nbytes, 'torch') / GiB:.0f} GiB)"}
            else:
                rec = study_one(nbytes, mode, device, args.reps)
            report["rows"].append(rec)
            print(_fmt(rec), flush=True)
    report["wall_s"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    return 0 if all(r["status"] in ("ok", "skipped") for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
