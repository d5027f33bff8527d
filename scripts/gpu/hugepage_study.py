"""Issue 3 study: does the pinned table's random-row rate depend on the host page
size behind it?

Random rows read through UVA fall ~10x from 64 MiB to 32 GiB tables, and small
tables move between allocations (placement_study.py).  Both look like address
translation (the GPU's TLB reach over host pages), not PCIe bandwidth.  Test:
the same lookup (reference Triton kernel, fp8 rows of 160 B, 2048 tokens x 16
heads, 8 fresh id sets) on a table allocated two ways:

* ``cudaHostAlloc`` (torch ``pin_memory=True``, what the pinned_uva backend does);
* anonymous memory advised for 2 MiB transparent huge pages
  (``madvise(MADV_HUGEPAGE)``), touched, then pinned with ``cudaHostRegister``.

Every table passes the bit-exact correctness gate before it is timed.

    PYTHONPATH=. python3 scripts/gpu/hugepage_study.py [--sizes 64MiB,1GiB,8GiB]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import sys

import torch

from ple_bench.backends.pinned import PinnedUVAEmbedding

HUGE = 2 << 20
MADV_HUGEPAGE = 14
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def anon_huge_kib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


class HugePages:
    """``nbytes`` of anonymous memory on a 2 MiB boundary, advised for THP and touched."""

    def __init__(self, nbytes: int, register: bool) -> None:
        self.nbytes = nbytes
        self.span = -(-nbytes // HUGE) * HUGE + HUGE
        base = _libc.mmap(None, self.span, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        self.base = base
        self.addr = -(-base // HUGE) * HUGE
        if _libc.madvise(self.addr, self.span - (self.addr - base), MADV_HUGEPAGE) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_HUGEPAGE) failed")
        ctypes.memset(self.addr, 0x5A, nbytes)  # fault every page in (as huge pages where granted)
        self.registered = False
        if register:
            rc = torch.cuda.cudart().cudaHostRegister(self.addr, nbytes, 3)  # portable | mapped
            if int(rc) != 0:
                raise RuntimeError(f"cudaHostRegister failed: {rc}")
            self.registered = True
        buf = (ctypes.c_uint8 * nbytes).from_address(self.addr)
        self.tensor = torch.frombuffer(buf, dtype=torch.uint8)

    def release(self) -> None:
        self.tensor = None
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.addr)
            self.registered = False
        if self.base:
            _libc.munmap(self.base, self.span)
            self.base = 0


class HugePagePinned(PinnedUVAEmbedding):
    """pinned_uva with its table on 2 MiB transparent huge pages, pinned by cudaHostRegister."""

    def allocate_table(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self.device.type != "cuda":
            return super().allocate_table(rows, dim, dtype)
        nbytes = rows * dim * torch.empty((), dtype=dtype).element_size()
        self._pages = HugePages(nbytes, register=True)
        return self._pages.tensor.view(dtype).view(rows, dim)

    def close(self) -> None:
        pages = getattr(self, "_pages", None)
        super().close()
        if pages is not None:
            torch.cuda.synchronize(self.device)
            pages.release()
            self._pages = None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64MiB,1GiB,8GiB")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("FAIL: needs CUDA")
        return 1
    from ple_bench.case import Case
    from ple_bench.executor import CaseExecutor
    from ple_bench.measure import TimingPolicy, measure
    from ple_bench.parallel import Topology
    from ple_bench.suite import parse_size

    print(f"THP: {open('/sys/kernel/mm/transparent_hugepage/enabled').read().strip()}", flush=True)
    device = torch.device("cuda", 0)
    policy = TimingPolicy(min_samples=10, max_samples=400, min_time_s=0.2, max_time_s=0.6, max_noise=0.02)
    ex = CaseExecutor(device=device)
    topo = Topology(1, 1, 1)
    groups = ex.groups_for(topo)
    failures = 0
    results: dict[tuple[str, str], float] = {}
    for size in args.sizes.split(","):
        rows = parse_size(size) // 160
        for label, impl in (("cudaHostAlloc", "pinned_uva"), ("THP+cudaHostRegister", f"{__name__}:HugePagePinned")):
            case = Case(impl=impl, vocab_size=rows, dim=160, dtype="fp8", num_heads=16, num_tokens=2048)
            try:
                ex.release_table()
                huge_before = anon_huge_kib()
                backend = ex.backend_for(case, topo, groups)
                huge = (anon_huge_kib() - huge_before) / 1024
                ids = ex.id_sets_for(case, topo, 8)
                ex._gate(case, backend, ids, None)  # bit-exact before any timing
                fn = ex._lookup_fn(case, backend, ids, None)
                meds = [measure(fn, device=device, policy=policy, cold_l2=True).stats()["median_ms"]
                        for _ in range(args.repeats)]
                med = sorted(meds)[len(meds) // 2]
                results[(size, label)] = med
                rate = 32768 / (med * 1e-3) / 1e6
                print(f"{size:>6} {label:<22} gate PASS; medians {', '.join(f'{m:.4f}' for m in meds)} ms; "
                      f"{rate:.0f} M rows/s, {rate * 160 / 1e3:.1f} GB/s; AnonHugePages +{huge:.0f} MiB",
                      flush=True)
            except Exception as exc:  # noqa: BLE001
                failures += 1
                print(f"FAIL {size} {label}: {type(exc).__name__}: {exc}", flush=True)
        a, b = results.get((size, "cudaHostAlloc")), results.get((size, "THP+cudaHostRegister"))
        if a and b:
            print(f"SUMMARY {size}: THP+register / cudaHostAlloc time = {b / a:.3f}", flush=True)
    ex.release_table()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
