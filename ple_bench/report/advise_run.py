"""``advise`` without ``--runs``: run the few cases the answer needs, for the asked shape.

A small suite, written as TOML next to the run (so the run can be re-run and re-read like any
other): the HBM-resident step (breakable and full graph), the UVA kernel and the CPU gather
prefetched in a breakable graph (eager without a GPU), ids on the host and the device, at the asked tokens and at two
compute lengths (the asked one and a quarter of it, so the model can fit the compute).  It runs
through the ordinary runner (progress bar, records, meta.json with the ceilings).  On a machine
without a GPU the suite runs in functional mode on a 64 MiB table: the code paths are checked,
the numbers are not timings, and advise says so and ranks nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

SUITE_TEMPLATE = """# written by `python -m ple_bench advise` for the asked shape
[suite]
description = "advise: the cases one answer needs ({shape})"

[suite.timing]
warmup_ms = 50
min_samples = 10
max_samples = 1000
min_time_s = 0.15
max_time_s = 0.6
max_noise = 0.02
cold_l2 = true

[defaults]
kind = "step"
dtype = "{dtype}"
dim = {dim}
num_heads = {heads}
table_bytes = {table_bytes}
num_tokens = {tokens}
compute_us = {computes}
ids_on = ["host", "device"]
graph = "{graph}"
prefetch = "on"

[[group]]
name = "resident"
impl = "device"
kernel = "triton_reference"
prefetch = "off"
graph = {resident_graphs}
exclude = [{{ graph = "full", ids_on = "device" }}]

[[group]]
name = "kernel on UVA"
impl = "pinned_uva"
kernel = "triton_reference"

[[group]]
name = "cpu gather"
impl = "pinned_cpu_gather"
"""

FUNCTIONAL_TABLE = 64 << 20


def suite_text(*, dim: int, dtype: str, heads: int, table_bytes: int, tokens: list[int], compute_us: float,
               gpu: bool = True) -> str:
    """The suite's TOML; without a GPU every step runs eagerly (graphs need CUDA)."""
    computes = sorted({round(compute_us / 4, 3), float(compute_us)})
    return SUITE_TEMPLATE.format(graph="breakable" if gpu else "eager",
                                 resident_graphs='["breakable", "full"]' if gpu else '["eager"]',shape=f"{table_bytes} B, dim {dim}, {dtype}, {heads} heads", dtype=dtype,
                                 dim=dim, heads=heads, table_bytes=table_bytes, tokens=list(tokens),
                                 computes=[c if c != int(c) else int(c) for c in computes])


def self_run(args: argparse.Namespace, table_bytes: int, tokens: list[int]) -> list[str] | None:
    """Run the suite; the run folder to read, or None when nothing can be ranked (functional run)."""
    from ..env import gpu_available
    from ..measure import TimingPolicy
    from ..runner import RunOptions, run_suite
    from ..suite import load_suite

    gpu = gpu_available()
    table = table_bytes if gpu else min(table_bytes, FUNCTIONAL_TABLE)
    text = suite_text(dim=args.dim, dtype=args.dtype, heads=args.heads, table_bytes=table, tokens=tokens,
                      compute_us=args.compute_us, gpu=gpu)
    suite_dir = Path(tempfile.mkdtemp(prefix="ple_bench-advise-"))
    path = suite_dir / "advise.toml"
    path.write_text(text, encoding="utf-8")
    suite = load_suite(path)
    policy = TimingPolicy.from_dict(suite.timing or {})
    note = ""
    if not gpu:
        policy = policy.scaled_for_cpu()
        note = (f"No CUDA GPU on this machine: advise ran its {len(suite.cases)} cases in functional mode (CPU, host "
                f"timer) on a {table >> 20} MiB table. These numbers check the code paths; they are not "
                "timings, and nothing is ranked from them. Run advise on a GPU, or give --runs.")
        print(note, file=sys.stderr)
    options = RunOptions(results_dir=Path(args.results_dir), reports_dir=Path(args.results_dir) / "_reports",
                         progress=True, report=False, functional_note=note, argv=sys.argv)
    summary = run_suite(suite, suite.cases, policy, options, "gpu" if gpu else "functional")
    print(f"advise: ran {sum(summary.counts.values())} cases into {summary.run_dir} ({summary.counts})",
          file=sys.stderr)
    (summary.run_dir / "advise.toml").write_text(text, encoding="utf-8")
    if not gpu:
        print(note)
        return None
    return [str(summary.run_dir)]
