"""Physical ceilings, measured now on this machine, in GB/s (decimal, 1e9 B/s).

A case's bandwidth is reported as a share of the ceiling that bounds it, so the
ceilings are measured with the same timer on the same machine, once per run.

CUDA (CUDA events, median of several repeats of each transfer):

* ``h2d_gbps`` / ``d2h_gbps``: pinned host <-> device copy of 256 MiB;
* ``d2d_gbps``: device copy of up to 1 GiB, counting read + write bytes;
* ``hbm_read_gbps``: reading up to 2 GiB of device memory and writing nothing, bytes read
  (:mod:`ple_bench.measure.hbm_read`; the ceiling of a step that only reads, as decoder layers do;
  ``hbm_read_gbps_<kernel>`` per read kernel, ``hbm_read_bytes`` the buffer);
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

Per case, measured by the engine the first time a case needs them (cached per
worker, kept in ``meta.json``), on the case's own table and timed as its lookups
are (:func:`ple_bench.measure.timer.measure` under :func:`bounded_policy` of the
case's policy: the same L2 flushing, rotating id sets):

* :func:`random_row_ceiling` (``ceilings["random_row"]``, keyed by
  :func:`random_row_key`: memory, table bytes, row bytes, id distribution, heads,
  rows, a pinned table's non-default ``host_alloc``): ``torch.index_select`` of rows
  of the case's id distribution (the workload module's, same parameters) from the tensor the case's kernel reads (device table,
  the pinned table's UVA view, or the CPU table in functional mode); bytes = rows x
  row bytes, as the lookup's GB/s counts them.  For a kernel that reads its rows in
  ascending id order (``PLEEmbedding.reads_sorted``: the ``dedup`` kernels) the same
  rows are gathered sorted (``order="sorted"``, key ending ``:sorted``): a random-order
  gather does not bound a sorted reader;
* :func:`host_gather_ceiling` (``ceilings["host_gather"]``, keyed
  ``<table bytes>:<rows>:<row bytes>``; host-side paths): a plain
  ``torch.index_select`` of that many uniform random rows of the case's own pinned
  table into pinned staging, with all of torch's intra-op threads, plus one
  host->device copy, timed as host paths are (``host_sync=True``), and the
  back-to-back warm figure beside it (``warm_ms``).

The once-per-run figures (:func:`measure_ceilings`) use
:func:`ple_bench.measure.repeat.repeat_timed` (the median of a few repeated calls);
a lookup without a per-case ceiling (records of older runs, multi-rank lookups) is
held against them.  :func:`measure_ceilings` also returns ``ceilings_timer`` (``"cuda_event"`` | ``"host_monotonic"``)
and ``ceilings_seconds`` (wall time spent).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from ..annotate import annotate
from ..backends.cuda.native import host_gather_module, native_error, new_host_gather
from ..backends.cuda.uva import cuda_view_of_pinned
from ..env import resolve_device
from .hbm_read import HBM_READ_BYTES, measure_hbm_read
from .profiler import windows_suspended
from .repeat import repeat_timed
from .timer import TimingPolicy, measure

ROW_SIZES = (160, 512)
COPY_BYTES = 256 << 20
D2D_BYTES = 1 << 30
GATHER_ROWS = 1 << 18
MIN_REPEATS = 3
MAX_REPEATS = 25


def _repeat_median_s(run: Callable[[], None], device: torch.device, budget_s: float) -> float:
    """One untimed warm-up call, then timed repeats (at least MIN_REPEATS, at
    most MAX_REPEATS, stopping once ``budget_s`` is spent; CUDA events on a GPU, the
    host clock on a CPU: :func:`ple_bench.measure.repeat.repeat_timed`); the median in s."""
    return repeat_timed(run, device=device, warmup=1, min_repeats=MIN_REPEATS, max_repeats=MAX_REPEATS,
                        budget_s=budget_s).median_s


def _gather_rates(table_bytes_view: torch.Tensor, out_device: torch.device, ids_device: torch.device,
                  budget_s: float, prefix: str, seed: int = 0) -> dict[str, float]:
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

        seconds = _repeat_median_s(run, out_device, budget_s)
        out[f"{prefix}_gbps_{row_bytes}B"] = n * row_bytes / seconds / 1e9
        out[f"{prefix}_rows_per_s_{row_bytes}B"] = n / seconds
    out[f"{prefix}_gbps"] = max(out[f"{prefix}_gbps_{r}B"] for r in ROW_SIZES)
    out[f"{prefix}_rows_per_s"] = max(out[f"{prefix}_rows_per_s_{r}B"] for r in ROW_SIZES)
    return out


def _cuda_ceilings(device: torch.device, budget_s: float, pinned_table_bytes: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    share = budget_s / 8  # h2d, d2h, d2d, the HBM read, 2 pinned gathers, 2 device gathers
    stream = torch.cuda.current_stream(device)
    free, _total = torch.cuda.mem_get_info(device)

    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    host.fill_(0x5A)
    dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    with annotate("ceiling_h2d"):
        res["h2d_gbps"] = COPY_BYTES / _repeat_median_s(lambda: dev.copy_(host, non_blocking=True), device, share) / 1e9
    with annotate("ceiling_d2h"):
        res["d2h_gbps"] = COPY_BYTES / _repeat_median_s(lambda: host.copy_(dev, non_blocking=True), device, share) / 1e9
    del host, dev

    d2d = max(COPY_BYTES, min(D2D_BYTES, (free // 4) >> 20 << 20))
    src = torch.empty(d2d, dtype=torch.uint8, device=device).fill_(0x5A)
    dst = torch.empty_like(src)
    with annotate("ceiling_d2d"):
        res["d2d_gbps"] = 2 * d2d / _repeat_median_s(lambda: dst.copy_(src), device, share) / 1e9
    del src, dst
    with annotate("ceiling_hbm_read"):
        res.update(measure_hbm_read(device, max(COPY_BYTES, min(HBM_READ_BYTES, (free // 4) >> 20 << 20)), share,
                                    min_repeats=MIN_REPEATS, max_repeats=MAX_REPEATS))

    table_bytes = max(pinned_table_bytes, max(ROW_SIZES)) // 512 * 512
    pinned = torch.empty(table_bytes, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(0x5A)
    with annotate("ceiling_pinned_random_row"):
        res.update(_gather_rates(cuda_view_of_pinned(pinned, device), device, device, share,
                                 "pinned_random_row"))
    del pinned
    dev_table_bytes = max(min(table_bytes, (free // 4) >> 9 << 9), 512)
    table = torch.empty(dev_table_bytes, dtype=torch.uint8, device=device).fill_(0x5A)
    with annotate("ceiling_device_random_row"):
        res.update(_gather_rates(table, device, device, share, "device_random_row"))
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
        seconds = _repeat_median_s(lambda: dst.copy_(src), torch.device("cpu"), share)
        res["host_memcpy_gbps"] = 2 * nbytes / seconds / 1e9
    del src, dst
    table_bytes = max(min(pinned_table_bytes, COPY_BYTES), max(ROW_SIZES)) // 512 * 512
    table = torch.empty(table_bytes, dtype=torch.uint8).fill_(0x5A)
    cpu = torch.device("cpu")
    with annotate("ceiling_host_random_row"):
        res.update(_gather_rates(table, cpu, cpu, share, "host_random_row"))
    res["ceilings_timer"] = "host_monotonic"
    return res


HOST_GATHER_ID_SETS = 8
HOST_GATHER_MIN_REPEATS = 20
HOST_GATHER_BUDGET_S = 0.3
#: a per-case ceiling is timed like its case but for at most this long
CEILING_MAX_TIME_S = 0.5
#: ... and once the noise target and the minimum sample count are met, for at least this long
#: (not the case's floor: a ceiling is one steady gather whose median settles in 10 samples;
#: the default suite measured 85 of them, 0.15 s each at the case's floor)
CEILING_MIN_TIME_S = 0.05


def bounded_policy(policy: "TimingPolicy | None") -> "TimingPolicy":
    """The case's timing policy for a ceiling of that case: the same warm-up, noise target,
    minimum sample count and L2 setting, sampling for at least
    :data:`CEILING_MIN_TIME_S` (or the case's floor, if shorter) and at most
    :data:`CEILING_MAX_TIME_S`."""
    policy = policy if policy is not None else TimingPolicy()
    max_time = min(policy.max_time_s, CEILING_MAX_TIME_S)
    return dataclasses.replace(policy, max_time_s=max_time,
                               min_time_s=min(policy.min_time_s, CEILING_MIN_TIME_S, max_time),
                               hot=False, graph=False)


def _uniform_id_sets(total: int, rows: int, n_sets: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randint(0, total, (rows,), generator=gen) for _ in range(n_sets)]


def _row_loop(table_bytes_view: torch.Tensor):
    """The native row loop (``ple_bench/backends/cuda/native/host_gather.cpp``) as a plain host
    gather ``fn(ids, out)`` with all torch threads and nothing else (no copy, no event), or
    None where the module is not built (no compiler or ninja, ``PLE_BENCH_NATIVE=0``)."""
    if host_gather_module() is None:
        return None
    gather = new_host_gather(table_bytes_view, torch.uint8, "cpu", table_bytes_view.shape[1],
                             torch.get_num_threads(), 0, 0, 0, 0)

    def run(ids: torch.Tensor, out: torch.Tensor) -> None:
        if gather.rows(ids, out, 0) < 0:
            raise native_error(gather)
    return run


def host_gather_ceiling(table: torch.Tensor, rows: int, device, *, seed: int = 0,
                        policy: "TimingPolicy | None" = None, cold_l2: bool | None = None,
                        budget_s: float = HOST_GATHER_BUDGET_S, warm: bool = True,
                        row_loop: bool = True, id_sets: list[torch.Tensor] | None = None,
                        ids: str = "uniform") -> dict[str, Any]:
    """The host-gather ceiling of ``table`` (a host ``[rows_total, ...]`` tensor, pinned
    on a GPU machine) for ``rows`` rows: the faster of two plain gathers of random rows
    (``id_sets``: flat id tensors of the case's distribution, named ``ids``; default
    :data:`HOST_GATHER_ID_SETS` uniform sets), one set per call in turn, into pinned
    staging with all torch threads, each followed by one ``copy_(non_blocking=True)`` to
    the device:

    * ``index_select`` -- ``torch.index_select`` (``torch_ms``);
    * ``row_loop`` -- the native row loop that ``pinned_cpu_gather`` uses, called alone
      (``row_loop_ms``; None where it is not built, or with ``row_loop=False``). On the lent
      H200 hosts it gathered in 72-89 % of index_select's time at 1-64 K rows, so
      index_select alone did not bound the path that uses it.

    ``gather`` names the one that binds (the lower median), ``ms`` is its median.  Each is
    timed as host-path lookups are: :func:`ple_bench.measure.timer.measure` with
    ``host_sync=True`` (each sample one synchronized call on the host clock), under
    :func:`bounded_policy` of ``policy``, the L2 flushed before each sample when
    ``cold_l2`` (default: the policy's).  With ``warm``, also the binding gather's figure
    of back-to-back calls without a flush (``warm_ms``; host clock, device synchronized
    after each: :func:`ple_bench.measure.repeat.repeat_timed`).
    Returns ``ms``, ``rows_per_s``, ``rows``, ``table_bytes``, ``row_bytes``, ``threads``,
    ``repeats``, ``timer``, ``cold_l2``, ``id_sets``, ``gather``, ``torch_ms``,
    ``row_loop_ms``, ``warm_ms``, ``warm_repeats``."""
    device = resolve_device(device)
    cuda = device.type == "cuda"
    pol = bounded_policy(policy)
    if cold_l2 is None:
        cold_l2 = pol.cold_l2
    view = table.view(torch.uint8).view(table.shape[0], -1)
    total, row_bytes = view.shape
    if id_sets is None:
        id_sets = _uniform_id_sets(total, rows, HOST_GATHER_ID_SETS, seed)
    elif any(s.numel() != rows for s in id_sets):
        raise ValueError(f"every id set of a host-gather ceiling has {rows} rows")
    id_sets = [s.reshape(-1).to(device="cpu", dtype=torch.int64) for s in id_sets]
    staging = torch.empty(rows, row_bytes, dtype=torch.uint8, pin_memory=cuda)
    dest = torch.empty(rows, row_bytes, dtype=torch.uint8, device=device) if cuda else None
    gathers: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "index_select": lambda ids, out: torch.index_select(view, 0, ids, out=out)}
    loop = _row_loop(view) if row_loop else None
    if loop is not None:
        gathers["row_loop"] = loop

    def plain(gather):
        turn = [0]

        def run() -> None:
            ids = id_sets[turn[0] % len(id_sets)]
            turn[0] += 1
            gather(ids, staging)
            if dest is not None:
                dest.copy_(staging, non_blocking=True)
        return run

    timed: dict[str, Any] = {}
    with annotate("ceiling_host_gather"):
        with windows_suspended():  # not the case's measurement: no profiler / trace window
            for name, gather in gathers.items():
                timed[name] = measure(plain(gather), device=device, policy=pol, cold_l2=bool(cold_l2),
                                      label=f"ceiling_host_gather_{name}", host_sync=True)
        medians = {name: m.stats()["median_ms"] for name, m in timed.items()}
        binding = min(medians, key=medians.get)
        meas, ms = timed[binding], medians[binding]
        out = {"ms": ms, "rows_per_s": rows / (ms / 1e3), "rows": rows, "table_bytes": total * row_bytes,
               "row_bytes": row_bytes, "threads": torch.get_num_threads(), "repeats": len(meas.samples_ms),
               "timer": meas.timer, "cold_l2": meas.cold_l2, "id_sets": len(id_sets), "ids": ids, "gather": binding,
               "torch_ms": medians["index_select"], "row_loop_ms": medians.get("row_loop")}
        if warm:
            back_to_back = repeat_timed(plain(gathers[binding]), device=device, host=True, warmup=3,
                                        min_repeats=HOST_GATHER_MIN_REPEATS, max_repeats=2000, budget_s=budget_s)
            out["warm_ms"] = back_to_back.median_ms
            out["warm_repeats"] = len(back_to_back.samples_ms)
    return out


#: rows a per-case random-row ceiling gathers per call (at least the case's own rows) ...
RANDOM_ROW_ROWS = GATHER_ROWS
#: ... and at most this many bytes of them (large rows: fewer rows)
RANDOM_ROW_BYTES = 256 << 20
#: functional (CPU) mode gathers fewer: its figures are not performance anyway
RANDOM_ROW_ROWS_CPU = 1 << 14


def random_row_rows(rows: int, row_bytes: int, num_heads: int, *, cpu: bool = False) -> int:
    """Rows per call of a random-row ceiling for a case of ``rows`` rows: at least the
    case's, else :data:`RANDOM_ROW_ROWS` (at most :data:`RANDOM_ROW_BYTES` of them), a
    multiple of ``num_heads`` (the ids are ``[tokens, heads]``, as the case's)."""
    cap = RANDOM_ROW_ROWS_CPU if cpu else RANDOM_ROW_ROWS
    n = max(int(rows), min(cap, RANDOM_ROW_BYTES // max(1, int(row_bytes))), 1)
    heads = max(1, int(num_heads))
    return -(-n // heads) * heads


#: the orders a random-row ceiling gathers its rows in: as drawn, or sorted by id (the order a
#: kernel declared ``sorted_reads`` reads them in; the key ends ``:sorted``)
ROW_ORDERS = ("random", "sorted")


def random_row_key(memory: str, table_bytes: int, row_bytes: int, ids: str, num_heads: int, rows: int,
                   host_alloc: str = "torch", order: str = "random") -> str:
    """``meta.json`` ``ceilings["random_row"]`` key of one random-row ceiling:
    ``<memory>:<table bytes>:<row bytes>:<ids>:h<heads>:n<rows>``, then ``:<host_alloc>``
    for a pinned table not allocated by torch (``exact``, ``exact_huge``: other pages,
    other address translation, another ceiling), then ``:sorted`` for the rows gathered in
    ascending id order (``order="sorted"``: the ceiling of a kernel that reads them so)."""
    if order not in ROW_ORDERS:
        raise ValueError(f"unknown row order {order!r}; allowed: {', '.join(ROW_ORDERS)}")
    key = f"{memory}:{int(table_bytes)}:{int(row_bytes)}:{ids}:h{int(num_heads)}:n{int(rows)}"
    if host_alloc not in ("", "torch"):
        key = f"{key}:{host_alloc}"
    return f"{key}:sorted" if order == "sorted" else key


def _word_view(table: torch.Tensor) -> torch.Tensor:
    """``table``'s rows as ``[rows, words]`` of the widest integer type dividing a row
    (8-byte loads where the row allows), the same bytes."""
    rows = table.shape[0]
    flat = table.view(torch.uint8).reshape(rows, -1)
    row_bytes = flat.shape[1]
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if row_bytes % width == 0:
            return flat.view(dtype)
    return flat


def random_row_ceiling(table: torch.Tensor, id_sets: list[torch.Tensor], device, *, memory: str,
                       policy: "TimingPolicy | None" = None, cold_l2: bool | None = None,
                       ids: str = "uniform", num_heads: int = 1, table_bytes: int | None = None,
                       host_alloc: str = "torch", order: str = "random") -> dict[str, Any]:
    """The random-row ceiling of one case's table: ``torch.index_select`` of the rows of
    ``id_sets`` (each a flat tensor of row ids of the case's distribution; one per call,
    in turn) from ``table`` (the tensor the case's kernel reads: device memory, the
    UVA view of a pinned table, or a CPU tensor) into a buffer on ``device``.

    Timed as the case's lookups are: :func:`ple_bench.measure.timer.measure` (CUDA
    events behind the launch-hiding spin, the L2 flushed before each sample when
    ``cold_l2``, default the policy's) under :func:`bounded_policy` of ``policy``.
    Bytes as the cases count them: rows x row bytes.

    ``order="sorted"``: each id set is sorted (duplicates kept: the same rows, in ascending
    order) before it is timed -- the ceiling of a kernel that reads its rows in that order
    (``PLEEmbedding.reads_sorted``, e.g. ``dedup_triton``), which a random-order gather does
    not bound: sorted access over a pinned table buys locality (pages, TLB entries, DRAM and
    PCIe row buffers).

    Returns ``key``, ``memory``, ``order``, ``ms``, ``gbps``, ``rows_per_s``, ``rows``,
    ``row_bytes``, ``table_bytes``, ``ids``, ``num_heads``, ``host_alloc``, ``id_sets``,
    ``cold_l2``, ``timer``, ``repeats``."""
    device = resolve_device(device)
    if not id_sets:
        raise ValueError("random_row_ceiling needs at least one id set")
    pol = bounded_policy(policy)
    if cold_l2 is None:
        cold_l2 = pol.cold_l2
    words = _word_view(table)
    row_bytes = words.shape[1] * words.element_size()
    if order not in ROW_ORDERS:
        raise ValueError(f"unknown row order {order!r}; allowed: {', '.join(ROW_ORDERS)}")
    sets = [s.reshape(-1).to(device=device, dtype=torch.int64) for s in id_sets]
    if order == "sorted":
        sets = [torch.sort(s).values for s in sets]
    rows = sets[0].numel()
    if any(s.numel() != rows for s in sets):
        raise ValueError("every id set of a random-row ceiling has the same number of rows")
    dst = torch.empty(rows, words.shape[1], dtype=words.dtype, device=device)
    turn = [0]

    def run() -> None:
        torch.index_select(words, 0, sets[turn[0] % len(sets)], out=dst)
        turn[0] += 1

    table_bytes = int(table_bytes if table_bytes is not None else words.shape[0] * row_bytes)
    label = f"ceiling_{memory}_{'sorted_' if order == 'sorted' else ''}random_row"
    with annotate(label), windows_suspended():  # not the case's: no profiler window
        meas = measure(run, device=device, policy=pol, cold_l2=bool(cold_l2), label=label)
    ms = meas.stats()["median_ms"]
    return {"key": random_row_key(memory, table_bytes, row_bytes, ids, num_heads, rows, host_alloc, order),
            "memory": memory, "host_alloc": host_alloc, "order": order,
            "ms": ms, "gbps": rows * row_bytes / (ms * 1e6), "rows_per_s": rows / (ms / 1e3), "rows": rows,
            "row_bytes": row_bytes, "table_bytes": table_bytes, "ids": ids, "num_heads": int(num_heads),
            "id_sets": len(sets), "cold_l2": meas.cold_l2, "timer": meas.timer, "repeats": len(meas.samples_ms)}


def measure_ceilings(device, *, budget_s: float = 5.0, pinned_table_bytes: int = 1 << 30) -> dict[str, Any]:
    """Measure this machine's ceilings now (see the module docstring for the
    keys).  ``budget_s`` is shared between the transfers (each still gets at
    least MIN_REPEATS repeats); ``pinned_table_bytes`` sizes the gather tables."""
    device = resolve_device(device)
    t0 = time.perf_counter()
    with annotate("ceilings"):
        if device.type == "cuda":
            with torch.cuda.device(device):
                res = _cuda_ceilings(device, budget_s, pinned_table_bytes)
        else:
            res = _cpu_ceilings(budget_s, pinned_table_bytes)
    res["ceilings_seconds"] = time.perf_counter() - t0
    return res
