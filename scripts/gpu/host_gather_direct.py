"""The CPU gather's direct path against the plain hand version, both timed by the
harness the cases use (``ple_bench.measure.measure``: host-sync timer, cold L2,
8 rotating host id sets, the suite's stopping rule), in one process on one GPU.

Session 3 measured ``pinned_cpu_gather`` at 24-66 % of the host-gather ceiling at
1-8 K rows, but the ceiling was timed back to back and warm while the lookup was
timed cold with events around each call: two harnesses.  This times, at each row
count, on a pinned table of ``--table-gib`` (exact pinning):

  hand            index_select into pinned staging + one ``copy_(non_blocking)`` to a
                  device buffer (the host-gather ceiling's function), through ``measure``
  hand_tT         the same with T torch threads
  ceiling_b2b     ``measure.host_gather_ceiling``'s back-to-back warm figure (``warm_ms``)
  ceiling         ``measure.host_gather_ceiling`` as the engine now records it (``ms``: through
                  ``measure``, host-sync timer, the policy's L2 setting)
  general         ``lookup`` through the general path (``direct = False``)
  direct          ``lookup`` through the direct path in one C++ call (native/host_gather.cpp)
  direct_python   the direct path's Python steps (one index_select, raw copy, raw event)
  direct_tT       the direct path with ``gather_threads = T``
  pf_general / pf_direct   start_prefetch + finalize(out=) (the step's lookup body)
  spin            a 200 us GPU spin alone; ov_general / ov_direct: start_prefetch, the
                  spin, finalize(out=): what the GPU work hides (ideal: max(spin, gather))

and the host cost of single calls (mean of 2 000): clocks, events, stream queries,
``is_pinned``, an output allocation.  Every variant's rows are checked byte for byte
against the general path first.
Run: ``python3 scripts/gpu/host_gather_direct.py --out $OUT/host_gather_direct.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ple_bench.backends import get_backend
from ple_bench.backends.cudart import RawEvent, current_stream_handle, memcpy_h2d_raw
from ple_bench.measure import TimingPolicy, host_gather_ceiling, measure

DIM, HEADS = 160, 16


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-gib", type=float, default=32.0)
    ap.add_argument("--rows", default="1024,4096,8192,65536")
    ap.add_argument("--threads", default="4,8")
    ap.add_argument("--max-time", type=float, default=1.0)
    ap.add_argument("--bisect", action="store_true", help="also time the direct path's layers one by one")
    ap.add_argument("--pieces", action="store_true",
                    help="also the native call without the backend's Python around it, and the wall time of each "
                         "piece inside it (HostGather.lookup_pieces: median of 500 synchronized calls)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    policy = TimingPolicy(max_time_s=args.max_time, min_time_s=0.05, hot=False, graph=False)
    vocab = int(args.table_gib * 2**30) // DIM
    rows_list = [int(r) for r in args.rows.split(",")]
    threads = [int(t) for t in args.threads.split(",") if t]
    t0 = time.perf_counter()
    b = get_backend("pinned_cpu_gather")(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=max(rows_list) // HEADS,
                                          device=dev, host_alloc="exact")
    b.fill_synthetic(1234, scale=0.5)
    print(f"table {b.table_bytes / 2**30:.1f} GiB pinned+filled in {time.perf_counter() - t0:.1f} s, "
          f"torch threads {torch.get_num_threads()}, default gather_threads {b.gather_threads}", flush=True)
    table = b.weight.view(torch.uint8).view(b.weight.shape[0], -1)
    all_threads = b.gather_threads

    report: dict = {"table_bytes": b.table_bytes, "torch_threads": torch.get_num_threads(), "rows": {}}
    # ---------------------------------------------------------------- single calls
    ev = torch.cuda.Event()
    raw = RawEvent()
    main_h = current_stream_handle(0)
    small_src = torch.empty(1024, 160, dtype=torch.uint8, pin_memory=True)
    small_dst = torch.empty(1024, 160, dtype=torch.uint8, device=dev)
    raw.record(main_h)
    torch.cuda.synchronize()
    micro = {
        "time.thread_time": per_call_us(time.thread_time),
        "time.perf_counter": per_call_us(time.perf_counter),
        "torch.cuda.Event.record": per_call_us(lambda: ev.record()),
        "RawEvent.record": per_call_us(lambda: raw.record(main_h)),
        "RawEvent.synchronize (done)": per_call_us(raw.synchronize),
        "torch.cuda.current_stream": per_call_us(lambda: torch.cuda.current_stream(dev)),
        "current_stream_handle": per_call_us(lambda: current_stream_handle(0)),
        "is_current_stream_capturing": per_call_us(torch.cuda.is_current_stream_capturing),
        "Tensor.is_pinned": per_call_us(small_src.is_pinned),
        "torch.empty 1024x2560 device": per_call_us(lambda: torch.empty(1024, 2560, dtype=torch.uint8, device=dev)),
        "raw memcpy 160 KB": per_call_us(lambda: memcpy_h2d_raw(small_dst.data_ptr(), small_src.data_ptr(),
                                                                small_src.numel(), main_h), 500),
        "torch copy_ 160 KB": per_call_us(lambda: small_dst.copy_(small_src, non_blocking=True), 500),
    }
    torch.cuda.synchronize()
    report["single_call_us"] = micro
    print("single calls (us):", json.dumps({k: round(v, 2) for k, v in micro.items()}), flush=True)

    spin_cycles = int(200e-6 * 1.98e9)  # about 200 us at the H200's 1.98 GHz (timed alone as "spin")

    for rows in rows_list:
        tokens = rows // HEADS
        gen = torch.Generator().manual_seed(rows)
        sets = [torch.randint(0, vocab, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        staging = torch.empty(rows, table.shape[1], dtype=torch.uint8, pin_memory=True)
        dest = torch.empty(rows, table.shape[1], dtype=torch.uint8, device=dev)
        out = torch.empty(tokens, HEADS * DIM, dtype=b.storage_dtype, device=dev)
        turn = [0]

        def nxt():
            turn[0] += 1
            return sets[turn[0] % 8]

        def hand():
            torch.index_select(table, 0, nxt().view(-1), out=staging)
            dest.copy_(staging, non_blocking=True)

        def lookup():
            return b.lookup(nxt())

        def prefetch():
            b.start_prefetch(nxt())
            return b.finalize(out=out)

        def spin():
            torch.cuda._sleep(spin_cycles)

        def overlap():
            b.start_prefetch(nxt())
            torch.cuda._sleep(spin_cycles)
            return b.finalize(out=out)

        # correctness first: every variant's rows equal the general path's
        for ids in sets[:3]:
            b.direct = False
            ref = b.lookup(ids).view(torch.uint8).clone()
            b.direct = True
            for native in (True, False):
                b.native = native
                got = b.lookup(ids).view(torch.uint8)
                out.view(torch.uint8).fill_(0x7F)
                b.start_prefetch(ids)
                pf = b.finalize(out=out).view(torch.uint8)
                torch.cuda.synchronize()
                if not (torch.equal(got, ref) and torch.equal(pf, ref)):
                    print(f"MISMATCH at {rows} rows (native={native})", flush=True)
                    return 1
            torch.index_select(table, 0, ids.view(-1), out=staging)
            dest.copy_(staging)
            if not torch.equal(dest.view(tokens, -1), ref):
                print(f"MISMATCH at {rows} rows (hand)", flush=True)
                return 1
        b.native = True
        report["gather_impl"] = b.stats()["gather_impl"]
        torch.cuda.synchronize()

        res: dict = {}

        def run(name, fn, direct=True, gather_threads=None, native=True):
            b.direct = direct
            b.native = native
            b.gather_threads = gather_threads or all_threads
            m = measure(fn, device=dev, policy=policy, cold_l2=True, label=name, host_sync=True)
            st = m.stats()
            res[name] = {"median_ms": st["median_ms"], "samples": len(m.samples_ms),
                         "event_median_ms": sorted(m.event_samples_ms)[len(m.event_samples_ms) // 2]
                         if m.event_samples_ms else None}

        run("hand", hand)
        if args.bisect:
            st = b._direct()
            dstage = st.staging(rows)
            main_h = current_stream_handle(0)

            def hand_raw():
                torch.index_select(table, 0, nxt().view(-1), out=staging)
                memcpy_h2d_raw(dest.data_ptr(), staging.data_ptr(), staging.numel(), main_h)

            def hand_dstage():
                torch.index_select(table, 0, nxt().view(-1), out=dstage)
                dest.copy_(dstage, non_blocking=True)

            def hand_fresh():
                d = torch.empty(rows, table.shape[1], dtype=torch.uint8, device=dev)
                torch.index_select(table, 0, nxt().view(-1), out=staging)
                d.copy_(staging, non_blocking=True)

            def rows_only():
                b._direct_rows(nxt(), out, main_h)

            def gather_only():
                b.host_gather(nxt().view(-1), dstage)

            def select_only():
                torch.index_select(table, 0, nxt().view(-1), out=staging)

            def select_dstage():
                torch.index_select(table, 0, nxt().view(-1), out=dstage)

            def select_direct_table():
                torch.index_select(st.table, 0, nxt().view(-1), out=staging)

            def select_numthreads():
                if torch.get_num_threads() == all_threads:
                    torch.index_select(table, 0, nxt().view(-1), out=staging)

            def select_thread_time():
                t0 = time.thread_time()
                torch.index_select(table, 0, nxt().view(-1), out=staging)
                return time.thread_time() - t0

            def select_reshape():
                torch.index_select(table, 0, nxt().reshape(-1), out=staging)

            def hand_alloc_out():
                torch.empty(tokens, HEADS * DIM, dtype=b.storage_dtype, device=dev)
                torch.index_select(table, 0, nxt().view(-1), out=staging)
                dest.copy_(staging, non_blocking=True)

            for name, fn in (("hand_raw", hand_raw), ("hand_dstage", hand_dstage), ("hand_fresh", hand_fresh),
                             ("direct_rows", rows_only), ("host_gather", gather_only), ("select_only", select_only),
                             ("select_dstage", select_dstage), ("select_direct_table", select_direct_table),
                             ("select_numthreads", select_numthreads), ("select_thread_time", select_thread_time),
                             ("select_reshape", select_reshape), ("hand_alloc_out", hand_alloc_out),
                             ("select_again", select_only)):
                run(name, fn)
            from ple_bench import annotate as ann
            ann.set_enabled(False)
            run("direct_nonvtx", lookup)
            ann.set_enabled(True)
            run("hand_again", hand)
        if args.pieces:
            b.native = True
            nat = b._direct().native
            main_h = current_stream_handle(0)
            fixed = torch.empty(tokens, HEADS * DIM, dtype=b.storage_dtype, device=dev)
            run("native_rows_fixed_out", lambda: nat.rows(nxt(), fixed, main_h))
            run("native_lookup_no_wrapper", lambda: nat.lookup(nxt(), main_h))
            names = ("alloc", "check", "wait", "gather", "copy", "record")
            got = []
            for _ in range(500):
                got.append(nat.lookup_pieces(nxt(), main_h))
                torch.cuda.synchronize()
            pieces = {n: sorted(g[i] for g in got)[len(got) // 2] for i, n in enumerate(names)}
            res["pieces_us"] = {"median_ms": sum(pieces.values()) / 1e3, "pieces_us": pieces}
            print(f"rows {rows}: native pieces (us, medians): "
                  + " ".join(f"{k}={v:.2f}" for k, v in pieces.items()), flush=True)
        for t in threads:
            torch.set_num_threads(t)
            run(f"hand_t{t}", hand)
            torch.set_num_threads(all_threads)
        cb = host_gather_ceiling(b.weight, rows, dev)
        res["ceiling_b2b"] = {"median_ms": cb["warm_ms"], "samples": cb["warm_repeats"]}
        res["ceiling"] = {"median_ms": cb["ms"], "samples": cb["repeats"]}  # host_sync, cold L2: the cases' harness
        run("general", lookup, direct=False)
        run("direct", lookup)
        run("direct_python", lookup, native=False)
        for t in threads:
            run(f"direct_t{t}", lookup, gather_threads=t)
        run("pf_general", prefetch, direct=False)
        run("pf_direct", prefetch)
        run("pf_direct_python", prefetch, native=False)
        if rows <= 8192:
            run("spin", spin)
            run("ov_general", overlap, direct=False)
            run("ov_direct", overlap)
        b.direct = True
        b.native = True
        b.gather_threads = all_threads
        report["rows"][rows] = res
        line = " ".join(f"{k}={v['median_ms']:.4f}" for k, v in res.items())
        print(f"rows {rows}: {line}", flush=True)

    names = list(dict.fromkeys(k for r in report["rows"].values() for k in r))
    print(f"\n{'ms':>14}" + "".join(f"{r:>10}" for r in rows_list))
    for n in names:
        print(f"{n:>14}" + "".join(f"{report['rows'][r][n]['median_ms']:>10.4f}" if n in report["rows"][r]
                                   else f"{'-':>10}" for r in rows_list))
    for r in rows_list:
        d = report["rows"][r]
        print(f"rows {r}: ceiling / direct = {100 * d['ceiling']['median_ms'] / d['direct']['median_ms']:.0f} % "
              f"(native), {100 * d['ceiling']['median_ms'] / d['direct_python']['median_ms']:.0f} % (python); "
              f"direct = {100 * d['hand']['median_ms'] / d['direct']['median_ms']:.0f} % of hand "
              f"(same harness); general = {100 * d['hand']['median_ms'] / d['general']['median_ms']:.0f} %; "
              f"b2b ceiling / direct = {100 * d['ceiling_b2b']['median_ms'] / d['direct']['median_ms']:.0f} %")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
