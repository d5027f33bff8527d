"""The decode step written by hand in plain torch (no ple_bench code), the check on the harness:
the same operation as ``DecodeStep`` -- ``n`` chained matmuls over a ring of 8 weights, the rows of
``ids`` from an FP8 table, ``out = x + (rows * scale) @ proj`` -- in the plainest form a user would
write it, timed on the suite's host-sync timer (launch -> ``synchronize`` returns; ids written
before the clock starts).

* ``hand_resident``: the table in HBM, ids on the device, ONE CUDA graph (``index_select`` straight
  into the consumer's input: what a single-GPU server replays; ``F.embedding`` is this kernel);
* ``hand_host``: the table in host memory, ids on the host: the compute's graph is launched, the
  host gathers the rows with ``torch.index_select`` while it runs, one pinned copy, then the
  consumer's graph (two graphs, no flag, no native code);
* ``hand_limit``: the step's graph without its lookup (the physical limit of any lookup path).

Used by ``host_graph_timeline.py`` (variants ``hand_*``) so the hand steps and the project's run in
one process on one calibrated matmul count.
"""

from __future__ import annotations

import statistics
import time

import torch

RING = 8


class HandStep:
    def __init__(self, device_table: torch.Tensor, host_table: torch.Tensor, scale: float, *,
                 tokens: int, heads: int, hidden: int, matmuls: int, seed: int = 5) -> None:
        if matmuls < 1:
            raise ValueError("matmuls must be >= 1")
        dim = device_table.shape[1]
        self.dev_table = device_table.view(torch.uint8)  # raw FP8 bytes: torch gathers any dtype
        self.host_table = host_table.view(torch.uint8)
        self.tokens, self.heads, self.dim, self.n = tokens, heads, dim, matmuls
        self.scale = scale
        g = torch.Generator(device="cuda").manual_seed(seed)
        bf16 = torch.bfloat16
        self.ws = [(torch.randn(hidden, hidden, device="cuda", generator=g) / hidden ** 0.5).to(bf16)
                   for _ in range(RING)]
        self.x0 = torch.randn(tokens, hidden, device="cuda", generator=g).to(bf16)
        self.proj = (torch.randn(heads * dim, hidden, device="cuda", generator=g) / (heads * dim) ** 0.5).to(bf16)
        self.ids_dev = torch.zeros(tokens * heads, dtype=torch.int64, device="cuda")
        self.ids_host = torch.zeros(tokens * heads, dtype=torch.int64).pin_memory()
        self.staging = torch.empty(tokens * heads, dim, dtype=torch.uint8).pin_memory()
        self.rows = torch.empty(tokens * heads, dim, dtype=torch.uint8, device="cuda")
        self.x = torch.empty(tokens, hidden, dtype=bf16, device="cuda")
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.outs: dict[str, torch.Tensor] = {}

    # the pieces, each the plainest torch
    def chain(self, out: torch.Tensor | None = None) -> torch.Tensor:
        x = self.x0
        for i in range(self.n):
            last = i == self.n - 1 and out is not None
            x = torch.mm(x, self.ws[i % RING], out=out) if last else x @ self.ws[i % RING]
        return x

    def consume(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        emb = rows.view(torch.float8_e4m3fn).view(self.tokens, -1).to(torch.bfloat16) * self.scale
        return torch.addmm(x, emb, self.proj)

    def _capture(self, name: str, body) -> None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.outs[name] = body()
        self.graphs[name] = g

    def build(self) -> None:
        def resident():
            return self.consume(self.chain(), torch.index_select(self.dev_table, 0, self.ids_dev))

        def compute():
            return self.chain(out=self.x)

        self._capture("resident", resident)
        self._capture("compute", compute)
        self._capture("consume", lambda: self.consume(self.x, self.rows))
        self._capture("limit", lambda: self.consume(self.chain(), self.rows))

    # the steps
    def feed(self, ids: torch.Tensor) -> None:
        flat = ids.reshape(-1)
        torch.cuda.synchronize()
        self.ids_host.numpy()[:] = flat.numpy()  # one memmove (torch's copy may wake its thread pool)
        self.ids_dev.copy_(self.ids_host, non_blocking=True)
        torch.cuda.synchronize()

    def run_resident(self) -> None:
        self.graphs["resident"].replay()

    def run_host(self) -> None:
        self.graphs["compute"].replay()                                     # the GPU computes ...
        torch.index_select(self.host_table, 0, self.ids_host, out=self.staging)  # ... the host gathers
        self.rows.copy_(self.staging, non_blocking=True)
        self.graphs["consume"].replay()

    def run_limit(self) -> None:
        self.graphs["limit"].replay()

    def check(self, ids: torch.Tensor) -> None:
        """Correctness before speed: the host step's rows and both steps' outputs against the
        device table's rows (rows poisoned first), byte-exact / to bf16 rounding."""
        self.feed(ids)
        ref = self.dev_table[ids.reshape(-1).cuda()]
        self.rows.fill_(0x7F)
        self.run_host()
        torch.cuda.synchronize()
        if not torch.equal(self.rows, ref):
            raise AssertionError("hand_host: rows differ from the table's")
        want = self.consume(self.chain(), ref)
        for name in ("resident", "consume"):
            self.outs[name].fill_(float("nan"))
        self.run_resident()
        self.run_host()
        torch.cuda.synchronize()
        for name in ("resident", "consume"):
            if not torch.allclose(self.outs[name].float(), want.float(), rtol=2e-2, atol=2e-2):
                raise AssertionError(f"hand {name}: output differs from the reference")

    def time_us(self, run, sets, reps: int) -> float:
        out = []
        for i in range(reps + 5):
            self.feed(sets[i % len(sets)])
            t0 = time.monotonic_ns()
            run()
            torch.cuda.synchronize()
            if i >= 5:
                out.append((time.monotonic_ns() - t0) / 1e3)
        return round(statistics.median(out), 2)
