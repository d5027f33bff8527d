"""GPU verification of the two PLE backends (device, pinned_uva) on one CUDA GPU.

Run from the repository root::

    PYTHONPATH=. python3 scripts/gpu/verify_backends.py            # full run, < 3 minutes
    PYTHONPATH=. python3 scripts/gpu/verify_backends.py --cpu-dry-run   # small sizes, no CUDA

Checks (each prints PASS/FAIL with details; a summary table and ``ALL PASS`` or
the failures at the end; exit status 1 on any failure):

* both backends x fp32/bf16/fp16/fp8: lookup and start_prefetch/finalize bit-exact
  against ``synthetic_rows`` and against a random full table, poisoned outputs,
  several batch sizes, int32 and int64 ids, every ETP rank's masked shard lookup;
* the compiled Triton kernel against ``torch_masked`` on the GPU;
* the pinned-UVA backend over a table of at least 8 GiB (fp8, dim 160), ids spread
  over the whole table including its first and last rows;
* prefetch ordering under load: ids written by the main stream after a long
  matmul chain, then start_prefetch / finalize (with a control run that launches
  the lookup on a side stream *without* waiting, to show the check can fail);
* ``prepare_prefetch`` / ``start_prefetch`` refused during CUDA-graph capture;
* the UVA view aliases the pinned host bytes (host writes seen by the GPU and back).

Timings of a few lookups are printed for information only.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import traceback

import torch

from ple_bench.backends import DTYPES, get_backend, get_kernel, synthetic_rows
from ple_bench.backends.formats import int_view
from ple_bench.parallel import Groups, Topology
from tests._reference import (
    assert_bytes_equal, bytes_of, full_lookup, masked_lookup, poisoned, random_table,
)

BACKENDS = ("device", "pinned_uva")
DTYPE_NAMES = ("fp32", "bf16", "fp16", "fp8")
RESULTS: list[tuple[str, str, float, str]] = []  # (name, PASS/FAIL/SKIP, seconds, detail)
DRY_RUN = False  # --cpu-dry-run: the Triton kernel is interpreted, so batches are kept tiny


def sz(gpu: int, dry: int) -> int:
    """A batch size: ``gpu`` on a GPU, ``dry`` in a CPU dry run."""
    return dry if DRY_RUN else gpu


def log(msg: str) -> None:
    print(msg, flush=True)


def run_check(name: str, fn, *args, **kwargs) -> None:
    t0 = time.perf_counter()
    try:
        detail = fn(*args, **kwargs) or ""
        status = "PASS"
        if isinstance(detail, tuple):
            status, detail = detail
    except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
        status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
        log(traceback.format_exc())
    dt = time.perf_counter() - t0
    RESULTS.append((name, status, dt, detail))
    log(f"{status:4s} {name} ({dt:.1f}s) {detail}")


def ids_on(device, tokens: int, heads: int, num_rows: int, seed: int, dtype=torch.int64):
    """[tokens, heads] ids, head h in its own range of the table, first and last
    rows included."""
    gen = torch.Generator(device=device).manual_seed(seed)
    bounds = [h * num_rows // heads for h in range(heads + 1)]
    cols = [torch.randint(bounds[h], max(bounds[h + 1], bounds[h] + 1), (tokens,),
                          generator=gen, device=device) for h in range(heads)]
    ids = torch.stack(cols, 1) if tokens else torch.empty(0, heads, dtype=torch.int64, device=device)
    if tokens * heads >= 2:
        ids[0, 0] = 0
        ids[-1, -1] = num_rows - 1
    return ids.to(dtype)


def synthetic_expected(ids, dim, seed, dtype):
    return synthetic_rows(ids.reshape(-1).long(), dim, seed, dtype).reshape(ids.shape[0], ids.shape[1] * dim)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------- single-process checks


def check_lookups(device, backend: str, dtype_name: str) -> str:
    dtype = DTYPES[dtype_name]
    checked = 0
    for num, dim, heads, padding in [(100_003, 160, 1, 64), (20_011, 37, 3, 7)]:
        emb = get_backend(backend)(num, dim, dtype=dtype_name, num_heads=heads, max_tokens=512,
                                   padding_size=padding, device=device)
        assert emb.table_for_kernel().device.type == device.type
        # synthetic content
        emb.fill_synthetic(seed=3, scale=0.5 if dtype_name == "fp8" else None)
        emb.check_loaded()
        for step, tokens in enumerate([1, 7, sz(512, 24), sz(100, 5), 0]):
            ids = ids_on(device, tokens, heads, num, seed=step, dtype=torch.int32 if step % 2 else torch.int64)
            expected = synthetic_expected(ids, dim, 3, dtype)
            assert_bytes_equal(emb.lookup(ids), expected, f"synthetic lookup {tokens} tokens")
            emb.start_prefetch(ids)
            out = poisoned(expected.shape, dtype, device)
            assert emb.finalize(out=out) is out
            assert_bytes_equal(out, expected, f"synthetic prefetch {tokens} tokens")
            emb.start_prefetch(ids)
            assert_bytes_equal(emb.finalize(), expected, f"synthetic prefetch (no out) {tokens}")
            checked += 3
        # random content (-0.0 included), loaded from a host table
        full = random_table(num, dim, dtype, seed=num)
        emb.load_full_table(full, scale=0.25 if dtype_name == "fp8" else None)
        full_dev = full.to(device)
        for step, tokens in enumerate([sz(300, 12), 5]):
            ids = ids_on(device, tokens, heads, num, seed=10 + step)
            expected = full_lookup(full_dev, ids)
            assert_bytes_equal(emb.lookup(ids), expected, f"random lookup {tokens}")
            emb.start_prefetch(ids)
            out = poisoned(expected.shape, dtype, device)
            assert_bytes_equal(emb.finalize(out=out), expected, f"random prefetch {tokens}")
            checked += 2
        if dtype_name == "fp8":
            acts = emb.dequantize(expected, torch.bfloat16)
            ref = (expected.double() * 0.25).to(torch.bfloat16)
            assert_bytes_equal(acts, ref, "fp8 dequantize")
            checked += 1
        emb.close()
    return f"{checked} bit-exact comparisons"


def check_etp_shards(device, backend: str, dtype_name: str) -> str:
    """Each rank of an ETP group, built for its rank in this one process: its
    masked lookup is its shard of the full table, zero bytes elsewhere, and the
    integer sum over the ranks is the full lookup."""
    dtype = DTYPES[dtype_name]
    num, dim, heads = 70_001, 24, 2
    full = random_table(num, dim, dtype, seed=5)
    full_dev = full.to(device)
    for topo in (Topology(1, 4, 4), Topology(2, 4, 2), Topology(1, 8, 8)):
        ids = ids_on(device, sz(257, 9), heads, num, seed=topo.etp)
        total = torch.zeros(ids.numel() * dim * dtype.itemsize, dtype=torch.int8, device=device)
        for rank in topo.etp_group_ranks(0):
            emb = get_backend(backend)(num, dim, dtype=dtype_name, num_heads=heads, device=device,
                                       groups=Groups(topology=topo, rank=rank))
            emb.load_full_table(full)
            s = emb.shard
            out = poisoned((ids.shape[0], heads, dim), dtype, device)
            emb.local_lookup(ids, out=out)
            assert_bytes_equal(out, masked_lookup(full_dev, ids, s.vocab_start, s.vocab_end),
                               f"{topo.as_dict()} rank {rank}")
            total += bytes_of(out).view(torch.int8)
            emb.close()
        assert torch.equal(total, bytes_of(full_lookup(full_dev, ids)).view(torch.int8)), \
            f"{topo.as_dict()}: integer sum over ETP ranks differs from the full lookup"
    return "ETP 4 (tp1, tp2) and 8"


def check_kernels(device) -> str:
    """The Triton kernel (compiled on a GPU) against torch_masked, poisoned outputs."""
    n = 0
    for dtype_name in DTYPE_NAMES:
        dtype = DTYPES[dtype_name]
        for dim in (1, 37, 160, 1280):
            rows, start = 1000, 3000
            shard = random_table(rows, dim, dtype, seed=dim).to(device)
            ids = torch.cat([torch.randint(0, 6000, (sz(4000, 40),), device=device),
                             torch.tensor([0, start - 1, start, start + rows - 1, start + rows],
                                          device=device)])
            outs = []
            for name in ("torch_masked", "triton_reference"):
                out = poisoned((ids.numel(), dim), dtype, device)
                get_kernel(name)(int_view(shard), ids, int_view(out), start, start + rows)
                outs.append(out)
            ref = masked_lookup(shard, ids.reshape(-1, 1) - start, 0, rows).reshape(-1, dim)
            assert_bytes_equal(outs[0], ref, f"torch_masked {dtype_name} dim {dim}")
            assert_bytes_equal(outs[1], ref, f"triton_reference {dtype_name} dim {dim}")
            n += 1
    return f"{n} dtype x dim combinations"


# ----------------------------------------------------------------- big pinned table


def free_host_cache():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()


def check_big_table(device, gib: float, backend: str) -> str:
    dim, heads, seed = 160, 16, 21
    rows = math.ceil(gib * 2**30 / dim)
    t0 = time.perf_counter()
    emb = get_backend(backend)(rows, dim, dtype="fp8", num_heads=heads, max_tokens=4096, device=device)
    t_alloc = time.perf_counter() - t0
    assert emb.table_bytes >= gib * 2**30, f"table is {emb.table_bytes} bytes, wanted >= {gib} GiB"
    if backend == "pinned_uva" and device.type == "cuda":
        assert emb.weight.is_pinned() and emb.table_for_kernel().device.type == "cuda"
    t0 = time.perf_counter()
    emb.fill_synthetic(seed, scale=1.0)
    t_fill = time.perf_counter() - t0
    checked = 0
    for step, tokens in enumerate([sz(4096, 70), 1, sz(333, 9)]):
        ids = ids_on(device, tokens, heads, rows, seed=step)
        if tokens > 64:  # the last 64 rows and the first 64, in the last / first head columns
            ids[:64, -1] = torch.arange(rows - 64, rows, device=device)
            ids[:64, 0] = torch.arange(64, device=device)
        expected = synthetic_expected(ids, dim, seed, torch.float8_e4m3fn)
        assert_bytes_equal(emb.lookup(ids), expected, f"big {backend} lookup {tokens}")
        emb.start_prefetch(ids)
        out = poisoned(expected.shape, torch.float8_e4m3fn, device)
        assert_bytes_equal(emb.finalize(out=out), expected, f"big {backend} prefetch {tokens}")
        checked += 2
    timings = time_lookups(device, emb, rows, heads, sizes=(1, 8) if DRY_RUN else (1, 64, 1024, 4096),
                           reps=2 if DRY_RUN else 20)
    TIMINGS.append((f"{backend} {emb.table_bytes / 2**30:.2f} GiB fp8 dim {dim} x {heads} heads", timings))
    emb.close()
    del emb
    free_host_cache()
    return (f"{rows:,} rows = {rows * dim / 2**30:.2f} GiB; alloc {t_alloc:.1f}s fill {t_fill:.1f}s; "
            f"{checked} bit-exact comparisons")


TIMINGS: list[tuple[str, dict]] = []


def time_lookups(device, emb, rows, heads, sizes=(1, 64, 1024, 4096), reps=20) -> dict:
    """Median lookup time (ms) per token count; information only."""
    result = {}
    for tokens in sizes:
        ids = ids_on(device, tokens, heads, rows, seed=tokens)
        samples = []
        for i in range(reps + 3):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                emb.lookup(ids)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                emb.lookup(ids)
                ms = (time.perf_counter() - t0) * 1e3
            if i >= 3:
                samples.append(ms)
        med = statistics.median(samples)
        gbps = tokens * heads * emb.row_bytes / (med * 1e-3) / 1e9
        result[tokens] = (med, gbps)
    return result


# ----------------------------------------------------------------- CUDA-only checks


def check_prefetch_under_load(device) -> str | tuple[str, str]:
    """ids written by the main stream after a long matmul chain; the side-stream
    lookup must see them (it waits for the main stream)."""
    num, dim, heads, seed = 1_000_003, 160, 4, 9
    emb = get_backend("pinned_uva")(num, dim, dtype="fp8", num_heads=heads, max_tokens=4096, device=device)
    emb.fill_synthetic(seed, scale=1.0)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16) / 128.0

    def busy(n):
        x = a
        for _ in range(n):
            x = x @ a
        return x

    # size the chain to ~40 ms (after a warm-up: cuBLAS set-up is not work)
    busy(2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    busy(20)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 20
    chain = max(20, int(0.040 / max(per, 1e-6)))
    host_ms = []
    for rep, tokens in enumerate([1, 7, 64, 256, 1000, 4096, 33, 2048]):
        truth = ids_on(device, tokens, heads, num, seed=100 + rep)
        stale = (truth + 1) % num  # every stale id names another row
        ids_buf = stale.clone()
        torch.cuda.synchronize()
        busy(chain)
        ids_buf.copy_(truth)  # on the main stream, after the busy work
        t0 = time.perf_counter()
        if rep % 2:
            temp = ids_buf.clone()  # a temporary the caller drops right away
            emb.start_prefetch(temp)
            del temp
            junk = torch.empty_like(ids_buf)
            junk.copy_(stale)  # may reuse the block if the prefetch did not keep it
        else:
            emb.start_prefetch(ids_buf)
        host_ms.append((time.perf_counter() - t0) * 1e3)
        busy(chain // 4)  # more main-stream work while the prefetch runs
        out = poisoned((tokens, heads * dim), torch.float8_e4m3fn, device)
        emb.finalize(out=out)
        assert_bytes_equal(out, synthetic_expected(truth, dim, seed, torch.float8_e4m3fn),
                           f"prefetch under load, rep {rep}, {tokens} tokens")
    # control: the same launch on a side stream without waiting sees stale ids
    side = torch.cuda.Stream(device=device)
    tokens = 2048
    truth = ids_on(device, tokens, heads, num, seed=999)
    ids_buf = ((truth + 1) % num).clone()
    out = torch.empty(tokens, heads, dim, dtype=torch.float8_e4m3fn, device=device)
    torch.cuda.synchronize()
    busy(chain)
    ids_buf.copy_(truth)
    with torch.cuda.stream(side):
        emb.local_lookup(ids_buf, out=out)
    torch.cuda.synchronize()
    control_stale = not torch.equal(
        bytes_of(out), bytes_of(synthetic_expected(truth, dim, seed, torch.float8_e4m3fn)))
    emb.close()
    detail = (f"8 reps, chain of {chain} matmuls (~{chain * per * 1e3:.0f} ms); start_prefetch host time "
              f"max {max(host_ms):.2f} ms; control without wait saw stale ids: {control_stale}")
    if not control_stale:
        return "PASS", detail + " (control did not race: the check may be weak on this machine)"
    return detail


def check_graph_capture_refused(device) -> str:
    emb = get_backend("pinned_uva")(1000, 16, dtype="bf16", max_tokens=8, device=device)
    emb.fill_synthetic(1)
    ids = ids_on(device, 4, 1, 1000, seed=0)
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device=device)
    errors = []
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        x.add_(1)
        for call in (emb.prepare_prefetch, lambda: emb.start_prefetch(ids)):
            try:
                call()
                errors.append(None)
            except RuntimeError as exc:
                errors.append(str(exc))
    for msg in errors:
        assert msg is not None, "allocation during capture was not refused"
        assert "before cudagraph capture" in msg, msg
    assert emb.prefetch_buffer is None, "a buffer was allocated during capture"
    # eagerly it works, and the lookup is right
    emb.prepare_prefetch()
    emb.start_prefetch(ids)
    assert_bytes_equal(emb.finalize(), synthetic_expected(ids, 16, 1, torch.bfloat16), "after capture")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, torch.ones_like(x)), "the captured work replays once"
    emb.close()
    return f"refused: {errors[0]!r}"


def check_uva_alias(device) -> str:
    from ple_bench.backends.uva import cuda_view_of_pinned

    host = torch.randint(1, 100, (1 << 20,), dtype=torch.int32).pin_memory()
    view = cuda_view_of_pinned(host, device)
    assert view.device.type == "cuda" and view.data_ptr() == host.data_ptr() and view.shape == host.shape
    host[12345] = -77  # host write, GPU read
    assert int(view[12345].item()) == -77
    assert torch.equal(view.cpu(), host)
    view[54321:54330].fill_(-5)  # GPU write, host read
    torch.cuda.synchronize()
    assert bool((host[54321:54330] == -5).all())
    # and the backend's table view
    emb = get_backend("pinned_uva")(5000, 32, dtype="fp16", device=device)
    emb.fill_synthetic(2)
    uva = emb.table_for_kernel()
    assert uva.device.type == "cuda" and uva.data_ptr() == emb.weight.data_ptr() and emb.weight.is_pinned()
    emb.weight[4321].fill_(3.5)
    ids = torch.tensor([[4321], [4320]], device=device)
    rows = emb.lookup(ids)
    assert bool((rows[0] == 3.5).all()), "a host write was not seen by the UVA lookup"
    assert_bytes_equal(rows[1:], synthetic_expected(ids[1:], 32, 2, torch.float16), "untouched row")
    emb.close()
    return "host<->GPU writes seen through the view"


# ----------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="no CUDA: run the device-agnostic checks on the CPU with small sizes")
    parser.add_argument("--big-gib", type=float, default=8.0, help="size of the big pinned table")
    args = parser.parse_args(argv)
    global DRY_RUN
    DRY_RUN = args.cpu_dry_run
    t_start = time.perf_counter()
    if args.cpu_dry_run:
        device = torch.device("cpu")
        big_gib = min(args.big_gib, 0.002)
    else:
        if not torch.cuda.is_available():
            log("FAIL no CUDA device (use --cpu-dry-run for a CPU smoke run)")
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
        big_gib = args.big_gib
        props = torch.cuda.get_device_properties(device)
        log(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}")
    import triton

    log(f"triton {triton.__version__}, python {sys.version.split()[0]}")

    for backend in BACKENDS:
        for dtype_name in DTYPE_NAMES:
            run_check(f"lookup {backend} {dtype_name}", check_lookups, device, backend, dtype_name)
    for backend in BACKENDS:
        for dtype_name in ("fp8", "bf16"):
            run_check(f"etp shards {backend} {dtype_name}", check_etp_shards, device, backend, dtype_name)
    run_check("triton vs torch_masked", check_kernels, device)
    run_check(f"big table pinned_uva >= {big_gib:g} GiB", check_big_table, device, big_gib, "pinned_uva")
    run_check(f"big table device >= {big_gib:g} GiB (timing baseline)", check_big_table, device, big_gib,
              "device")
    if device.type == "cuda":
        run_check("prefetch ordering under load", check_prefetch_under_load, device)
        run_check("prefetch buffer refused during graph capture", check_graph_capture_refused, device)
        run_check("UVA view aliases pinned host memory", check_uva_alias, device)
    else:
        for name in ("prefetch ordering under load", "prefetch buffer refused during graph capture",
                     "UVA view aliases pinned host memory"):
            RESULTS.append((name, "SKIP", 0.0, "needs CUDA"))

    log("\nlookup timings (information only; median of 20, CUDA events; GB/s = looked-up row bytes / time)")
    log(f"{'table':48s} {'tokens':>7s} {'ms':>9s} {'GB/s':>8s}")
    for label, timings in TIMINGS:
        for tokens, (ms, gbps) in timings.items():
            log(f"{label:48s} {tokens:7d} {ms:9.4f} {gbps:8.2f}")

    log("\nsummary")
    width = max(len(r[0]) for r in RESULTS)
    log(f"{'check':{width}s}  result  seconds  detail")
    for name, status, dt, detail in RESULTS:
        log(f"{name:{width}s}  {status:6s}  {dt:7.1f}  {detail}")
    failures = [r for r in RESULTS if r[1] == "FAIL"]
    log(f"total {time.perf_counter() - t_start:.1f}s")
    if failures:
        log(f"FAILURES: {len(failures)}: " + ", ".join(r[0] for r in failures))
        return 1
    log("ALL PASS" if not any(r[1] == "SKIP" for r in RESULTS) else "ALL PASS (some checks skipped: no CUDA)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
