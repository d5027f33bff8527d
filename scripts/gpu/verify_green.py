"""GPU check of the ``sm_limit`` axis: green-context streams (run from the repo root):

    PYTHONPATH=. python3 scripts/gpu/verify_green.py

Prints PASS / FAIL / INFO lines; exits 1 if any FAIL.  Well under a minute on an H200.

1. Versions: torch, whether its GreenContext is built and has ``Stream()``,
   the ``cuda.bindings`` version.
2. Grants: ``green_stream`` for 8, 16, 32, 66 SMs (and the whole device) by the
   default way and, when both exist, by each way (torch / cuda.bindings):
   which way, SMs granted (read back from the driver); PASS when every grant
   is >= the request and <= the device's SMs.  A stream with a priority (-1).
3. Correctness: ``pinned_uva`` with ``sm_limit=16``, kernels triton_reference
   and triton_tuned, 64 MiB fp8 dim-160 table, 16 heads, 512 tokens of random
   ids, start_prefetch/finalize on the green stream with the output and the
   prefetch buffer poisoned (0xFF = fp8 NaN): bit-exact against
   ``synthetic_rows``.
4. Effect: a chain of 8192x8192 bf16 matmuls timed (CUDA events) on a normal
   stream and on a 16-SM green stream: PASS when green / normal > 3 (about
   device SMs / granted SMs expected).  INFO: the same with a Triton spin
   kernel of 4 programs per SM.
5. INFO: the 512-token lookup (prefetch + finalize) with the side stream on
   16 SMs vs all SMs.
6. INFO (last: a failed capture may leave the device in a bad state): whether
   start_prefetch + finalize on a green side stream can be captured in a CUDA
   graph (graph = breakable / full cases with sm_limit need it), and whether
   the replay is correct.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback

import torch

from ple_bench.backends import green
from ple_bench.backends.formats import int_view
from ple_bench.backends.pinned import PinnedUVAEmbedding
from ple_bench.backends.synthetic import synthetic_rows

SEED = 11
REQUESTS = (8, 16, 32, 66)
failures: list[str] = []
T0 = time.perf_counter()


def verdict(ok: bool | None, what: str) -> None:
    tag = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    if ok is False:
        failures.append(what)
    print(f"{tag}: {what}  [{time.perf_counter() - T0:.1f} s]", flush=True)


def check(name: str, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - report and go on
        verdict(False, f"{name}: {type(exc).__name__}: {exc}")
        traceback.print_exc(limit=4)


class forced_way:
    """Make green_stream use only one way ("torch" or "cuda.bindings")."""

    def __init__(self, way: str | None):
        self.way = way

    def __enter__(self):
        self.saved = (green.load_torch_green, green.load_driver)
        if self.way == "cuda.bindings":
            green.load_torch_green = lambda: None
        elif self.way == "torch":
            green.load_driver = lambda: None
        return self

    def __exit__(self, *exc):
        green.load_torch_green, green.load_driver = self.saved


def ways() -> list[str]:
    out = []
    if green.load_torch_green() is not None:
        out.append("torch")
    if green.load_driver() is not None:
        out.append("cuda.bindings")
    return out


# ----------------------------------------------------------------- 1. versions
def versions(dev) -> None:
    try:
        import cuda.bindings as cb  # type: ignore[import-not-found]

        cbv = getattr(cb, "__version__", "unknown")
    except ImportError:
        cbv = None
    note = green.torch_green_note() or "usable (GreenContext.Stream() present)"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    verdict(None, f"{torch.cuda.get_device_name(dev)}, {sms} SMs; torch {torch.__version__} "
                  f"(CUDA {torch.version.cuda}); torch green contexts: {note}; cuda.bindings: {cbv}")
    if not ways():
        verdict(False, "no way to make a green context here (neither torch's Stream() nor cuda.bindings)")


# ----------------------------------------------------------------- 2. grants
def grants(dev) -> None:
    total = torch.cuda.get_device_properties(dev).multi_processor_count
    for way in [None] + (ways() if len(ways()) > 1 else []):
        label = way or "default way"
        with forced_way(way):
            rows = []
            ok = True
            for n in REQUESTS + (total,):
                stream, handle = green.green_stream(dev, n)
                try:
                    x = torch.ones(1 << 20, device=dev)
                    with torch.cuda.stream(stream):
                        y = x * 3.0
                    torch.cuda.current_stream(dev).wait_stream(stream)
                    works = bool((y == 3.0).all())
                finally:
                    handle.close()
                g = handle.granted_sms
                good = works and (g is None or n <= g <= total)
                ok &= good
                rows.append(f"{n}->{g if g is not None else '?'} via {handle.via}"
                            + ("" if works else " (stream work WRONG)"))
                if handle.notes:
                    verdict(None, f"{label}, {n} SMs: notes: {'; '.join(handle.notes)}")
            verdict(ok, f"{label}: requested->granted SMs: {', '.join(rows)} (device {total})")
    if "cuda.bindings" in ways():
        stream, handle = green.green_stream(dev, 16, priority=-1)
        try:
            prio = stream.priority if hasattr(stream, "priority") else "?"
        finally:
            handle.close()
        verdict(handle.via == "cuda.bindings" and handle.granted_sms is not None,
                f"priority -1 on a 16-SM green stream via {handle.via}: granted {handle.granted_sms}, "
                f"torch reports priority {prio}")


# ----------------------------------------------------------------- 3. correctness
def make_backend(dev, kernel: str, sm_limit: int, tokens: int = 512, heads: int = 16, dim: int = 160):
    vocab = (64 << 20) // dim
    b = PinnedUVAEmbedding(vocab, dim, dtype="fp8", num_heads=heads, max_tokens=tokens, device=dev,
                           kernel=kernel, sm_limit=sm_limit)
    b.fill_synthetic(SEED, scale=0.5)
    b.prepare_prefetch()
    return b


def correctness(dev) -> None:
    gen = torch.Generator(device=dev)
    gen.manual_seed(5)
    for kernel in ("triton_reference", "triton_tuned"):
        b = make_backend(dev, kernel, 16)
        try:
            ids = torch.randint(0, b.num_embeddings, (512, 16), device=dev, generator=gen)
            want = synthetic_rows(ids.reshape(-1), 160, SEED, b.storage_dtype).reshape(512, -1).to(dev)
            out = torch.empty(512, 16 * 160, dtype=b.storage_dtype, device=dev)
            ok = True
            for rep in range(3):
                out.view(torch.uint8).fill_(0xFF)
                b.prefetch_buffer.view(torch.uint8).fill_(0xFF)
                b.start_prefetch(ids)
                b.finalize(out=out)
                torch.cuda.synchronize(dev)
                ok &= torch.equal(int_view(out), int_view(want))
                ids = torch.randint(0, b.num_embeddings, (512, 16), device=dev, generator=gen)
                want = synthetic_rows(ids.reshape(-1), 160, SEED, b.storage_dtype).reshape(512, -1).to(dev)
            verdict(ok, f"{kernel}: 512x16 fp8 lookups on a green stream (sm_limit=16, granted "
                        f"{b.sm_limit_granted}, via {b.green_via}) equal synthetic_rows (3 id sets, poisoned)")
        finally:
            b.close()


# ----------------------------------------------------------------- 4./5. effect
def event_ms(fn, stream, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        with torch.cuda.stream(stream):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record(stream)
            fn()
            z.record(stream)
        z.synchronize()
        times.append(a.elapsed_time(z))
    return statistics.median(times)


def spin_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def spin(out_ptr, n_iter, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        x = tl.arange(0, BLOCK).to(tl.float32) + pid
        for _ in range(n_iter):
            x = x * 0.999 + 0.5
        tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), x)

    return spin


def effect(dev) -> None:
    total = torch.cuda.get_device_properties(dev).multi_processor_count
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    bufs = [torch.empty_like(a), torch.empty_like(a)]

    def chain():
        x = a
        for i in range(4):
            torch.mm(x, w, out=bufs[i % 2])
            x = bufs[i % 2]

    normal = torch.cuda.Stream(device=dev)
    for way in [None] + (ways() if len(ways()) > 1 else []):
        with forced_way(way):
            gstream, handle = green.green_stream(dev, 16)
        try:
            t_norm = event_ms(chain, normal, 5)
            t_green = event_ms(chain, gstream, 3)
            ratio = t_green / t_norm
            expect = total / handle.granted_sms if handle.granted_sms else float("nan")
            verdict(ratio > 3, f"matmul chain (4 x 8192^3 bf16): normal stream {t_norm:.2f} ms, 16-SM green "
                               f"stream via {handle.via} (granted {handle.granted_sms}) {t_green:.2f} ms: "
                               f"ratio {ratio:.2f} (device/granted SMs = {expect:.2f}; PASS if > 3)")
            try:
                spin = spin_kernel()
                progs = 4 * total
                out = torch.empty(progs * 128, device=dev)

                def run_spin():
                    spin[(progs,)](out, 20000, BLOCK=128, num_warps=4)

                s_norm = event_ms(run_spin, normal, 5)
                s_green = event_ms(run_spin, gstream, 3)
                verdict(None, f"Triton spin kernel, {progs} programs: normal {s_norm:.3f} ms, 16-SM green "
                              f"{s_green:.3f} ms, ratio {s_green / s_norm:.2f}")
            except Exception as exc:  # noqa: BLE001 - an extra, not a check
                verdict(None, f"Triton spin kernel not timed: {type(exc).__name__}: {exc}")
        finally:
            torch.cuda.synchronize(dev)
            handle.close()
    del a, w, bufs


def lookup_timing(dev) -> None:
    gen = torch.Generator(device=dev)
    gen.manual_seed(9)
    for kernel in ("triton_reference", "triton_tuned"):
        res = {}
        for limit in (0, 16):
            b = make_backend(dev, kernel, limit)
            try:
                sets = [torch.randint(0, b.num_embeddings, (512, 16), device=dev, generator=gen) for _ in range(8)]
                turn = [0]
                out = torch.empty(512, 16 * 160, dtype=b.storage_dtype, device=dev)

                def fn():
                    b.start_prefetch(sets[turn[0] % len(sets)])
                    turn[0] += 1
                    b.finalize(out=out)

                res[limit] = (event_ms(fn, torch.cuda.current_stream(dev), 30, warmup=3), b.sm_limit_granted)
            finally:
                b.close()
        (t_all, _), (t16, g) = res[0], res[16]
        verdict(None, f"{kernel}: 512-token lookup (prefetch+finalize, 64 MiB fp8 table): side stream on all SMs "
                      f"{t_all * 1e3:.1f} us, on 16 SMs (granted {g}) {t16 * 1e3:.1f} us, ratio {t16 / t_all:.2f}")


def graph_capture(dev) -> None:
    b = make_backend(dev, "triton_reference", 16, tokens=64)
    try:
        gen = torch.Generator(device=dev)
        gen.manual_seed(3)
        ids = torch.randint(0, b.num_embeddings, (64, 16), device=dev, generator=gen)
        out = torch.empty(64, 16 * 160, dtype=b.storage_dtype, device=dev)
        b.start_prefetch(ids)
        b.finalize(out=out)  # warm-up (compiles) outside the capture
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                b.start_prefetch(ids)
                b.finalize(out=out)
        except Exception as exc:  # noqa: BLE001 - what we want to know
            verdict(None, f"CUDA-graph capture across a green side stream FAILS: {type(exc).__name__}: {exc} "
                          "(graph = breakable/full cases with sm_limit will fail)")
            return
        ok = True
        for _ in range(2):
            ids.copy_(torch.randint(0, b.num_embeddings, (64, 16), device=dev, generator=gen))
            out.view(torch.uint8).fill_(0xFF)
            graph.replay()
            torch.cuda.synchronize(dev)
            want = synthetic_rows(ids.reshape(-1), 160, SEED, b.storage_dtype).reshape(64, -1).to(dev)
            ok &= torch.equal(int_view(out), int_view(want))
        verdict(None, f"CUDA-graph capture across a green side stream works; replay "
                      f"{'equals' if ok else 'DIFFERS FROM'} synthetic_rows")
    finally:
        b.close()


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=dev)
    check("versions", versions, dev)
    check("grants", grants, dev)
    check("correctness", correctness, dev)
    check("effect", effect, dev)
    check("lookup timing", lookup_timing, dev)
    check("graph capture", graph_capture, dev)
    print(f"{len(failures)} FAIL(s) in {time.perf_counter() - T0:.1f} s", flush=True)
    for f in failures:
        print(f"  FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
