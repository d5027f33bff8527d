"""Physical ceilings, measured now on this machine, in GB/s (decimal, 1e9 B/s).

A case's bandwidth is reported as a share of the ceiling that bounds it, so the
ceilings are measured with the same timer on the same machine, once per run.

CUDA (CUDA events, median of several repeats of each transfer):

* ``h2d_gbps`` / ``d2h_gbps``: pinned host <-> device copy of 256 MiB;
* ``d2d_gbps``: device copy of up to 1 GiB, counting read + write bytes;
* ``pinned_random_row_gbps_{160,512}B``: uniform random rows gathered from a
  pinned host table through its UVA view (``cuda_view_of_pinned`` +
  ``torch.index_select``), bytes = rows x row size (the rows read);
  ``pinned_random_row_gbps`` is the best of the two sizes and
  ``pinned_random_row_rows_per_s`` the best row rate (``..._rows_per_s_{160,512}B``
  per size);
* ``device_random_row_*``: the same gather from a device table.

CPU (``time.perf_counter_ns``; names say "host"): ``host_memcpy_gbps`` (read +
write bytes, like ``d2d_gbps``) and ``host_random_row_*`` (the same gather from
a host table).

Per table and row count (:func:`host_gather_ceiling`, measured by the engine
for the cases of host-side paths, kept in ``meta.json`` under
``ceilings["host_gather"]``): a plain ``torch.index_select`` of that many
uniform random rows of the case's own pinned table into pinned staging, with
all of torch's intra-op threads, plus one host->device copy of the staging
buffer, synchronized; host clock, median over rotating id sets.

Both also return ``ceilings_timer`` (``"cuda_event"`` | ``"host_monotonic"``)
and ``ceilings_seconds`` (wall time spent).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ..annotate import annotate

ROW_SIZES = (160, 512)
COPY_BYTES = 256 << 20
D2D_BYTES = 1 << 30
GATHER_ROWS = 1 << 18
MIN_REPEATS = 3
MAX_REPEATS = 25


def _repeat_median_s(run: Callable[[], None], timed: Callable[[Callable[[], None]], float],
                     budget_s: float) -> float:
    """One untimed warm-up call, then timed repeats (at least MIN_REPEATS, at
    most MAX_REPEATS, stopping once ``budget_s`` is spent); the median in s."""
    run()
    t0 = time.perf_counter()
    times: list[float] = []
    while len(times) < MIN_REPEATS or (len(times) < MAX_REPEATS and time.perf_counter() - t0 < budget_s):
        times.append(timed(run))
    return statistics.median(times)


def _cuda_timed(stream: torch.cuda.Stream) -> Callable[[Callable[[], None]], float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(run: Callable[[], None]) -> float:
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return timed


def _host_timed(run: Callable[[], None]) -> float:
    t0 = time.perf_counter_ns()
    run()
    return (time.perf_counter_ns() - t0) / 1e9


def _gather_rates(table_bytes_view: torch.Tensor, out_device: torch.device, ids_device: torch.device,
                  timed, budget_s: float, prefix: str, seed: int = 0) -> dict[str, float]:
    """Gather GATHER_ROWS random rows of each size in ROW_SIZES from
    ``table_bytes_view`` (a flat uint8 tensor, possibly a UVA view)."""
    out: dict[str, float] = {}
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for row_bytes in ROW_SIZES:
        rows_total = table_bytes_view.numel() // row_bytes
        n = min(GATHER_ROWS, rows_total)
        # the widest integer type that divides the row: 8-byte loads per element
        table = table_bytes_view[: rows_total * row_bytes].view(torch.int64).view(rows_total, row_bytes // 8)
        ids = torch.randint(0, rows_total, (n,), generator=gen).to(ids_device)
        dst = torch.empty(n, row_bytes // 8, dtype=torch.int64, device=out_device)

        def run() -> None:
            torch.index_select(table, 0, ids, out=dst)

        seconds = _repeat_median_s(run, timed, budget_s)
        out[f"{prefix}_gbps_{row_bytes}B"] = n * row_bytes / seconds / 1e9
        out[f"{prefix}_rows_per_s_{row_bytes}B"] = n / seconds
    out[f"{prefix}_gbps"] = max(out[f"{prefix}_gbps_{r}B"] for r in ROW_SIZES)
    out[f"{prefix}_rows_per_s"] = max(out[f"{prefix}_rows_per_s_{r}B"] for r in ROW_SIZES)
    return out


def _cuda_ceilings(device: torch.device, budget_s: float, pinned_table_bytes: int) -> dict[str, Any]:
    from ..backends.uva import cuda_view_of_pinned

    res: dict[str, Any] = {}
    share = budget_s / 7  # h2d, d2h, d2d, 2 pinned gathers, 2 device gathers
    stream = torch.cuda.current_stream(device)
    timed = _cuda_timed(stream)
    free, _total = torch.cuda.mem_get_info(device)

    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    host.fill_(0x5A)
    dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    with annotate("ceiling_h2d"):
        res["h2d_gbps"] = COPY_BYTES / _repeat_median_s(lambda: dev.copy_(host, non_blocking=True), timed, share) / 1e9
    with annotate("ceiling_d2h"):
        res["d2h_gbps"] = COPY_BYTES / _repeat_median_s(lambda: host.copy_(dev, non_blocking=True), timed, share) / 1e9
    del host, dev

    d2d = max(COPY_BYTES, min(D2D_BYTES, (free // 4) >> 20 << 20))
    src = torch.empty(d2d, dtype=torch.uint8, device=device).fill_(0x5A)
    dst = torch.empty_like(src)
    with annotate("ceiling_d2d"):
        res["d2d_gbps"] = 2 * d2d / _repeat_median_s(lambda: dst.copy_(src), timed, share) / 1e9
    del src, dst

    table_bytes = max(pinned_table_bytes, max(ROW_SIZES)) // 512 * 512
    pinned = torch.empty(table_bytes, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(0x5A)
    with annotate("ceiling_pinned_random_row"):
        res.update(_gather_rates(cuda_view_of_pinned(pinned, device), device, device, timed, share,
                                 "pinned_random_row"))
    del pinned
    dev_table_bytes = max(min(table_bytes, (free // 4) >> 9 << 9), 512)
    table = torch.empty(dev_table_bytes, dtype=torch.uint8, device=device).fill_(0x5A)
    with annotate("ceiling_device_random_row"):
        res.update(_gather_rates(table, device, device, timed, share, "device_random_row"))
    del table
    stream.synchronize()
    empty_host_cache = getattr(torch._C, "_host_emptyCache", None)
    if empty_host_cache is not None:  # give the pinned staging memory back
        empty_host_cache()
    torch.cuda.empty_cache()
    res["ceilings_timer"] = "cuda_event"
    return res


def _cpu_ceilings(budget_s: float, pinned_table_bytes: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    share = budget_s / 3
    nbytes = min(COPY_BYTES, max(pinned_table_bytes, 1 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(0x5A)  # touched: no zero-page reads
    dst = torch.empty_like(src)
    with annotate("ceiling_host_memcpy"):
        res["host_memcpy_gbps"] = 2 * nbytes / _repeat_median_s(lambda: dst.copy_(src), _host_timed, share) / 1e9
    del src, dst
    table_bytes = max(min(pinned_table_bytes, COPY_BYTES), max(ROW_SIZES)) // 512 * 512
    table = torch.empty(table_bytes, dtype=torch.uint8).fill_(0x5A)
    cpu = torch.device("cpu")
    with annotate("ceiling_host_random_row"):
        res.update(_gather_rates(table, cpu, cpu, _host_timed, share, "host_random_row"))
    res["ceilings_timer"] = "host_monotonic"
    return res


HOST_GATHER_ID_SETS = 8
HOST_GATHER_MIN_REPEATS = 20
HOST_GATHER_BUDGET_S = 0.3


def host_gather_ceiling(table: torch.Tensor, rows: int, device, *, seed: int = 0,
                        budget_s: float = HOST_GATHER_BUDGET_S) -> dict[str, Any]:
    """The host-gather ceiling of ``table`` (a host ``[rows_total, ...]`` tensor, pinned
    on a GPU machine) for ``rows`` rows: ``torch.index_select`` of uniform random rows
    into pinned staging (all torch threads) + one host->device copy, synchronized,
    host clock.  Returns ``ms`` (median per gather), ``rows_per_s``, ``rows``,
    ``table_bytes``, ``row_bytes``, ``threads``, ``repeats``, ``timer``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda = device.type == "cuda"
    view = table.view(torch.uint8).view(table.shape[0], -1)
    total, row_bytes = view.shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    id_sets = [torch.randint(0, total, (rows,), generator=gen) for _ in range(HOST_GATHER_ID_SETS)]
    staging = torch.empty(rows, row_bytes, dtype=torch.uint8, pin_memory=cuda)
    dest = torch.empty(rows, row_bytes, dtype=torch.uint8, device=device) if cuda else None
    turn = [0]

    def run() -> None:
        ids = id_sets[turn[0] % len(id_sets)]
        turn[0] += 1
        torch.index_select(view, 0, ids, out=staging)
        if dest is not None:
            dest.copy_(staging, non_blocking=True)
            torch.cuda.synchronize(device)

    with annotate("ceiling_host_gather"):
        for _ in range(3):
            run()
        times: list[float] = []
        t0 = time.perf_counter()
        while len(times) < HOST_GATHER_MIN_REPEATS or (time.perf_counter() - t0 < budget_s and len(times) < 2000):
            times.append(_host_timed(run))
    seconds = statistics.median(times)
    return {"ms": seconds * 1e3, "rows_per_s": rows / seconds, "rows": rows, "table_bytes": total * row_bytes,
            "row_bytes": row_bytes, "threads": torch.get_num_threads(), "repeats": len(times),
            "timer": "host_sync" if cuda else "host_monotonic"}


def measure_ceilings(device, *, budget_s: float = 5.0, pinned_table_bytes: int = 1 << 30) -> dict[str, Any]:
    """Measure this machine's ceilings now (see the module docstring for the
    keys).  ``budget_s`` is shared between the transfers (each still gets at
    least MIN_REPEATS repeats); ``pinned_table_bytes`` sizes the gather tables."""
    device = torch.device(device)
    t0 = time.perf_counter()
    with annotate("ceilings"):
        if device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            with torch.cuda.device(device):
                res = _cuda_ceilings(device, budget_s, pinned_table_bytes)
        else:
            res = _cpu_ceilings(budget_s, pinned_table_bytes)
    res["ceilings_seconds"] = time.perf_counter() - t0
    return res
