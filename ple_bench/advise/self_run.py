"""``advise`` without ``--runs``: run the few cases the answer needs, for the asked shape.

A small suite, written as TOML next to the run (so the run can be re-run and re-read like any
other).  By default (``--measure few``) only the cases whose answer no model settles, so that a
new shape is answered in under a minute on one H200: the posted host gather (``pinned_host_flag``,
the host gather posted beside one full graph: the pinned path that reached the resident step at
every shape measured, docs/runs/*-shapes-*) and the UVA kernel prefetched in a breakable graph,
ids on the host as a server has them, at the asked tokens and the asked compute, each held
against its resident steps (the device table, ids on the device; breakable, whose full graph is
timed too, on both timers) that the suite loader adds.  The table is pinned exactly, on 2 MiB
transparent huge pages where the kernel grants them (``host_alloc = "exact_huge"``: no power-of-two
rounding of a 56 GiB table to 64, and pinned in about a third of the time 4 KiB pages take -- 35 s
for 56 GiB on the H200 host); ``exact`` where the kernel has no THP.  ``--measure all``
runs the wider suite: the CPU gather as eager breaks, the host gather as a graph node, ids on
the device too, and a quarter of the compute (so the model can fit the compute's slope).

On a machine without a GPU advise refuses (exit 2: give ``--runs``) unless ``--functional-check``
asks for a handful of functional cases on a 1 MiB table: the code paths are checked, the numbers
are not timings, and advise says so and ranks nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from ..backends.cuda.host_alloc import thp_policy
from ..env import gpu_available
from ..measure import TimingPolicy
from ..results import ensure_writable_dir
from ..run.loop import RunOptions, run_suite
from ..spec.suite import load_suite
from ..verdict import FUNCTIONAL_TEXT

SUITE_HEAD = """# written by `python -m ple_bench advise` for the asked shape
[suite]
description = "advise: the cases one answer needs ({shape})"

[suite.timing]
warmup_ms = 30
min_samples = 10
max_samples = 600
min_time_s = 0.1
max_time_s = 0.3
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
ids_on = {ids_on}
graph = "{graph}"
prefetch = "on"
host_alloc = "{host_alloc}"
"""

#: ``--measure few``: the paths no model settles (their resident steps come with them)
FEW_GROUPS = """
[[group]]
name = "host gather posted beside one graph"
impl = "pinned_host_flag"
graph = "{host_graph_mode}"
ids_on = "host"

[[group]]
name = "kernel on UVA"
impl = "pinned_uva"
kernel = "triton_reference"
"""

#: ``--measure all``: every path, ids on the host and the device, two compute lengths
ALL_GROUPS = """
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

[[group]]
name = "cpu gather in the graph"
impl = "pinned_host_graph"
graph = "{host_graph_mode}"

[[group]]
name = "cpu gather posted after the launch"
impl = "pinned_host_flag"
graph = "{host_graph_mode}"
ids_on = "host"
"""

MEASURE_CHOICES = ("few", "all")

#: without a GPU (``--functional-check``): the code paths on a small table, one token count, one compute
FUNCTIONAL_TABLE = 1 << 20


def _pinned_alloc() -> str:
    """``exact_huge`` where transparent huge pages can be asked for (``madvise`` / ``always``),
    else ``exact``."""
    return "exact_huge" if thp_policy() in ("madvise", "always") else "exact"


def suite_text(*, dim: int, dtype: str, heads: int, table_bytes: int, tokens: list[int], compute_us: float,
               gpu: bool = True, measure: str = "few") -> str:
    """The suite's TOML (``measure``: ``few`` or ``all``, see the module's text).  Without a GPU
    every step runs eagerly (graphs need CUDA), at the first asked token count, the asked compute
    and ids on the device only (where a path allows), one case per path, to check the code paths."""
    if measure not in MEASURE_CHOICES:
        raise ValueError(f"--measure: {measure!r}; allowed: {', '.join(MEASURE_CHOICES)}")
    wide = measure == "all"
    computes = sorted({round(compute_us / 4, 3), float(compute_us)}) if gpu and wide else [float(compute_us)]
    tokens = list(tokens) if gpu else list(tokens[:1])
    ids_on = '["host", "device"]' if gpu and wide else ('"host"' if gpu else '"device"')
    fields = dict(graph="breakable" if gpu else "eager",
                  resident_graphs='["breakable", "full"]' if gpu else '["eager"]',
                  host_graph_mode="full" if gpu else "eager",
                  shape=f"{table_bytes} B, dim {dim}, {dtype}, {heads} heads", dtype=dtype,
                  dim=dim, heads=heads, table_bytes=table_bytes, tokens=tokens, ids_on=ids_on,
                  host_alloc=_pinned_alloc() if gpu else "torch",
                  computes=[c if c != int(c) else int(c) for c in computes])
    return (SUITE_HEAD + (ALL_GROUPS if wide else FEW_GROUPS)).format(**fields)


NO_GPU = ("no CUDA GPU on this machine: advise ranks decode steps measured on a GPU, and a run here (CPU, "
          "functional mode) times none. Give measured runs: --runs RUN_DIR ... (e.g. docs/runs/*), or run "
          "advise on a GPU; --functional-check runs its {n} cases here to check the code paths (ranks nothing)")

EXIT_INTERRUPTED = 130


def functional_case_count(args: argparse.Namespace, tokens: list[int]) -> int:
    with tempfile.TemporaryDirectory(prefix="ple_bench-advise-") as where:
        return len(_write_suite(args, FUNCTIONAL_TABLE, tokens, gpu=False, where=Path(where))[1].cases)


def _write_suite(args: argparse.Namespace, table: int, tokens: list[int], gpu: bool, where: Path | None = None):
    text = suite_text(dim=args.dim, dtype=args.dtype, heads=args.heads, table_bytes=table, tokens=tokens,
                      compute_us=args.compute_us, gpu=gpu, measure=getattr(args, "measure", "few"))
    path = (where or Path(tempfile.mkdtemp(prefix="ple_bench-advise-"))) / "advise.toml"
    path.write_text(text, encoding="utf-8")
    return text, load_suite(path)


def self_run(args: argparse.Namespace, table_bytes: int, tokens: list[int]) -> list[str] | int:
    """Run the suite; the run folder to read, or the exit code when nothing can be ranked (a
    functional run: 0; interrupted: 130)."""
    gpu = gpu_available()
    table = table_bytes if gpu else min(table_bytes, FUNCTIONAL_TABLE)
    text, suite = _write_suite(args, table, tokens, gpu)
    ensure_writable_dir(args.results_dir, "--results-dir")
    policy = TimingPolicy.from_dict(suite.timing or {})
    note = ""
    if not gpu:
        policy = dataclasses.replace(policy.scaled_for_cpu(), min_samples=2, max_samples=2)
        note = (f"No CUDA GPU on this machine: advise runs its {len(suite.cases)} cases in functional mode (CPU, "
                f"host timer) on a {table >> 10} KiB table. They check the code paths; they are not timings, "
                "and nothing is ranked from them.")
        print(note, file=sys.stderr)
    # an advise run is not continued with `run --resume`: its suite is advise's own (give --runs instead)
    options = RunOptions(results_dir=Path(args.results_dir),
                         progress=True, functional_note=note, argv=sys.argv, resume_args=None)
    summary = run_suite(suite, suite.cases, policy, options, "gpu" if gpu else "functional")
    (summary.run_dir / "advise.toml").write_text(text, encoding="utf-8")
    print(f"advise: ran {sum(summary.counts.values())} cases into {summary.run_dir} ({summary.counts})",
          file=sys.stderr)
    if summary.interrupted:
        print(f"advise: interrupted, nothing ranked; the cases measured so far are in {summary.run_dir} "
              f"(advise --runs {summary.run_dir} ranks them once they are all there)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not gpu:
        print(f"advise: {FUNCTIONAL_TEXT} (functional check done: {summary.counts['ok']} ok, "
              f"{summary.counts['failed']} failed, {summary.counts['invalid']} invalid; nothing ranked: no GPU timings)")
        return summary.exit_code
    return [str(summary.run_dir)]
