"""GPU verification of the breakable CUDA graph and the synthetic decode step.

Run from the repo root on a CUDA machine (about 1-2 minutes on an H200)::

    PYTHONPATH=. python3 scripts/gpu/verify_graphs.py

Checks (each prints PASS or FAIL with numbers):
 1. breakable-graph replay of the step gives the reference embeddings and the
    eager output for FRESH ids copied into the static input each step
    (pinned prefetch, pinned synchronous, device-resident);
 2. two tables in one breakable graph: each replayed break reads its own table;
 3. the prefetch buffer's allocation during a capture is refused, and leaves no
    capture open;
 4. full-graph mode on one rank (pinned prefetch and device), fresh ids;
 5. a quick step measurement: fp8, dim 160, 16 heads, 256 tokens, table about
    4 GiB, compute_us 100; device vs pinned, prefetch off / on, graph modes.
Exit status 0 only if every check passed.
"""

from __future__ import annotations

import math
import sys
import time
import traceback

import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.case import Case
from ple_bench.graphs import BreakableGraph, eager_break
from ple_bench.step import DecodeStep, check_step, run_step_case

DIM, HEADS, TOKENS = 160, 16, 256
FP8_SCALE = 0.5
FAILED: list[str] = []
T0 = time.time()


def report(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}  [{time.time() - T0:.0f}s]",
          flush=True)
    if not ok:
        FAILED.append(name)


def guarded(name: str):
    def deco(fn):
        def run(*args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # a check that crashes is a failure, the others still run
                traceback.print_exc()
                report(name, False, f"{type(exc).__name__}: {exc}")
        return run
    return deco


def make_backend(impl: str, vocab: int, seed: int, device: torch.device):
    b = get_backend(impl)(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device=device)
    b.fill_synthetic(seed, scale=FP8_SCALE)
    b.check_loaded()
    return b


def random_ids(vocab: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    per = vocab // HEADS
    local = torch.randint(0, per, (TOKENS, HEADS), generator=gen, device=device)
    return local + torch.arange(HEADS, device=device) * per


def ref_rows(ids: torch.Tensor, seed: int) -> torch.Tensor:
    return synthetic_rows(ids.reshape(-1), DIM, seed, torch.float8_e4m3fn).reshape(ids.shape[0], -1)


def bytes_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


# --------------------------------------------------------------------------- 1
@guarded("breakable_fresh_ids")
def check_breakable_fresh_ids(device: torch.device) -> None:
    vocab, seed = 1 << 20, 4242
    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    for impl, prefetch in (("pinned_uva", True), ("pinned_uva", False), ("device", False)):
        name = f"breakable_fresh_ids[{impl},prefetch={prefetch}]"
        backend = make_backend(impl, vocab, seed, device)
        step = DecodeStep(backend, hidden=1024, num_tokens=TOKENS, compute_layers=4,
                          prefetch=prefetch, graph="breakable", device=device)
        worst_rows, worst_out = 0, 0.0
        for i in range(6):
            ids = random_ids(vocab, gen, device)
            # eager output of these ids, for the comparison
            step.set_inputs(ids)
            eager_out = step.run("eager").clone()
            step.rows.view(torch.uint8).fill_(0x7F)
            step.out.fill_(float("nan"))
            if backend.prefetch_buffer is not None:
                backend.prefetch_buffer.view(torch.uint8).fill_(0x7F)
            step.set_inputs(ids)  # fresh ids into the static input, then replay
            out = step.run("breakable")
            torch.cuda.synchronize(device)
            worst_rows = max(worst_rows, bytes_differ(step.rows, ref_rows(ids, seed)))
            err = (out.float() - eager_out.float()).abs().max().item()
            worst_out = max(worst_out, err / max(eager_out.float().abs().max().item(), 1.0))
        graph = step.graphs[("step", "breakable")]
        kinds = [k for k, _ in graph.steps]
        n_eager = kinds.count("eager")
        want_eager = 2 if prefetch else 1
        check_step(step, [random_ids(vocab, gen, device) for _ in range(3)], seed)  # raises on mismatch
        ok = worst_rows == 0 and math.isfinite(worst_out) and worst_out < 2e-2 and n_eager == want_eager
        report(name, ok, f"6 fresh-id steps, embedding bytes wrong={worst_rows}, "
                         f"max rel diff vs eager={worst_out:.2e}, replay={kinds}")
        backend.close()
        step.close()


# --------------------------------------------------------------------------- 2
@guarded("two_tables_one_graph")
def check_two_tables(device: torch.device) -> None:
    vocab = 1 << 18
    a = make_backend("pinned_uva", vocab, 11, device)
    b = make_backend("pinned_uva", vocab, 99, device)
    a.prepare_prefetch()
    b.prepare_prefetch()
    ids = torch.zeros(TOKENS, HEADS, dtype=torch.int64, device=device)
    out_a = torch.empty(TOKENS, HEADS * DIM, dtype=torch.float8_e4m3fn, device=device)
    out_b = torch.empty_like(out_a)
    total = torch.empty(TOKENS, HEADS * DIM, dtype=torch.bfloat16, device=device)
    layers = {"layer1": a, "layer14": b}
    w = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    x = torch.randn(256, 1024, device=device, dtype=torch.bfloat16)

    def body():
        # the breaks are bound to whatever the registry says *at capture*
        l1, l14 = layers["layer1"], layers["layer14"]
        eager_break(l1.start_prefetch)(ids)
        eager_break(l14.start_prefetch)(ids)
        x @ w  # something captured between the breaks
        eager_break(l1.finalize)(out=out_a)
        eager_break(l14.finalize)(out=out_b)
        total.copy_(l1.dequantize(out_a, torch.bfloat16) + l14.dequantize(out_b, torch.bfloat16))

    g = BreakableGraph("breakable", device=device)
    g.capture(body, warmup=1)
    layers["layer1"], layers["layer14"] = b, a  # a registry rebound after capture must not matter
    gen = torch.Generator(device=device)
    gen.manual_seed(2)
    bad_a = bad_b = bad_total = 0
    for _ in range(5):
        fresh = random_ids(vocab, gen, device)
        ids.copy_(fresh)
        for t in (out_a, out_b):
            t.view(torch.uint8).fill_(0x7F)
        total.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(device)
        ra, rb = ref_rows(fresh, 11), ref_rows(fresh, 99)
        bad_a += bytes_differ(out_a, ra)
        bad_b += bytes_differ(out_b, rb)
        want = ra.to(torch.bfloat16) * FP8_SCALE + rb.to(torch.bfloat16) * FP8_SCALE
        bad_total += int((total.float() - want.float()).abs().gt(1e-2 * want.float().abs() + 1e-2).sum())
    report("two_tables_one_graph", bad_a == 0 and bad_b == 0 and bad_total == 0,
           f"5 replays, wrong bytes table A={bad_a} table B={bad_b}, wrong sums={bad_total}, "
           f"eager calls={len(g.eager_calls)}")
    a.close()
    b.close()


# --------------------------------------------------------------------------- 3
@guarded("prefetch_alloc_refused_in_capture")
def check_alloc_refused(device: torch.device) -> None:
    backend = make_backend("pinned_uva", 1 << 16, 5, device)  # prepare_prefetch never called
    ids = torch.zeros(TOKENS, HEADS, dtype=torch.int64, device=device)
    g = BreakableGraph("full", device=device)
    message = ""
    try:
        g.capture(lambda: backend.start_prefetch(ids))
    except RuntimeError as exc:
        message = str(exc)
    refused = "eagerly" in message and "capture" in message
    still_capturing = torch.cuda.is_current_stream_capturing()
    usable = float(torch.ones(4, device=device).sum().item()) == 4.0
    no_buffer = backend.prefetch_buffer is None
    report("prefetch_alloc_refused_in_capture",
           refused and not still_capturing and usable and no_buffer and not g.captured,
           f"error={message!r}, capture left open={still_capturing}, buffer allocated={not no_buffer}")
    backend.close()


# --------------------------------------------------------------------------- 4
@guarded("full_graph_single_rank")
def check_full_graph(device: torch.device) -> None:
    vocab, seed = 1 << 20, 777
    gen = torch.Generator(device=device)
    gen.manual_seed(3)
    for impl, prefetch in (("pinned_uva", True), ("device", False)):
        backend = make_backend(impl, vocab, seed, device)
        step = DecodeStep(backend, hidden=1024, num_tokens=TOKENS, compute_layers=4,
                          prefetch=prefetch, graph="full", device=device)
        check_step(step, [random_ids(vocab, gen, device) for _ in range(5)], seed)
        graph = step.graphs[("step", "full")]
        ok = len(graph.segments) == 1 and graph.eager_calls == []
        report(f"full_graph_single_rank[{impl},prefetch={prefetch}]", ok,
               f"5 fresh-id replays equal the reference, segments={len(graph.segments)}, "
               f"eager calls={len(graph.eager_calls)}")
        backend.close()
        step.close()


# --------------------------------------------------------------------------- 5
@guarded("step_measurement")
def measure_steps(device: torch.device) -> None:
    from ple_bench.measure import TimingPolicy

    policy = TimingPolicy(warmup_ms=20.0, min_samples=10, max_samples=300, min_time_s=0.1,
                          max_time_s=1.0, max_noise=0.02, cold_l2=False, hot=False, graph=False)
    vocab = 26_000_000  # x 160 B = 3.9 GiB (under 4 GiB: pinned blocks round up to a power of two)
    seed = 1234
    gen = torch.Generator(device=device)
    gen.manual_seed(4)
    id_sets = torch.stack([random_ids(vocab, gen, device) for _ in range(8)])
    plan = [
        ("device", False, "eager"), ("device", False, "breakable"),
        ("pinned_uva", False, "eager"), ("pinned_uva", True, "eager"),
        ("pinned_uva", True, "breakable"), ("pinned_uva", True, "full"),
    ]
    header = (f"{'impl':<11}{'pf':<4}{'graph':<10}{'step':>8}{'lookup':>8}{'compute':>8}{'exposed':>8}"
              f"{'overlap':>8}{'slowdn':>8}{'offload':>8}{'brk_cost':>9}{'matmuls':>8}")
    rows = []
    resident: dict[str, float] = {}
    backends: dict[str, object] = {}
    all_ok = True
    for impl, prefetch, mode in plan:
        if impl not in backends:
            for other in list(backends):
                backends.pop(other).close()
            torch.cuda.empty_cache()
            t = time.time()
            backends[impl] = make_backend(impl, vocab, seed, device)
            print(f"  built {impl} table: {vocab * DIM / 2**30:.2f} GiB in {time.time() - t:.1f}s", flush=True)
        case = Case(kind="step", impl=impl, vocab_size=vocab, dim=DIM, dtype="fp8", num_heads=HEADS,
                    num_tokens=TOKENS, prefetch=prefetch, graph=mode, compute_us=100.0, hidden=4096)
        rec = run_step_case(case, backends[impl], id_sets, None, policy, device,
                            resident_baseline=resident.get(mode), table_seed=seed)
        if impl == "device":
            resident[mode] = rec["step_ms"]

        def f(key, width=8, digits=3):
            v = rec.get(key)
            return f"{v:>{width}.{digits}f}" if isinstance(v, (int, float)) else f"{'-':>{width}}"

        rows.append(f"{impl:<11}{'y' if prefetch else 'n':<4}{mode:<10}{f('step_ms')}{f('lookup_ms')}"
                    f"{f('compute_ms')}{f('exposed_ms')}{f('overlap_efficiency')}{f('compute_slowdown')}"
                    f"{f('offload_overhead')}{f('graph_break_cost_ms', 9)}{rec['compute_matmuls']:>8}")
        finite = all(math.isfinite(rec[k]) and rec[k] > 0 for k in ("step_ms", "lookup_ms", "compute_ms"))
        all_ok = all_ok and finite
        print(f"  {impl} prefetch={prefetch} graph={mode}: step {rec['step_ms']:.3f} ms "
              f"({rec['n_samples']} samples), matmul {rec['matmul_us']:.1f} us", flush=True)
    for b in backends.values():
        b.close()
    print(header)
    for r in rows:
        print(r)
    print("  (ms; overlap = share of the lookup hidden; slowdn = in-step compute / compute alone - 1; "
          "offload = step / device step of the same graph mode - 1; brk_cost = breakable - full step)")
    report("step_measurement", all_ok, "all step/lookup/compute times finite and positive")


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL no CUDA device")
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    check_breakable_fresh_ids(device)
    check_two_tables(device)
    check_alloc_refused(device)
    check_full_graph(device)
    measure_steps(device)
    print(f"{'ALL PASS' if not FAILED else 'FAILED: ' + ', '.join(FAILED)} in {time.time() - T0:.0f}s")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
