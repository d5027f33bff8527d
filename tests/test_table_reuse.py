"""One table per run: the suite loop's order puts every case of a table (``Case.table_key``) next to
each other, so the executor builds (pins, fills) each table once, whichever groups its cases come from."""

from __future__ import annotations

import itertools

import torch

from ple_bench.backends import get_backend
from ple_bench.spec.case import Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.measure import TimingPolicy
from ple_bench.spec.suite import load_suite
from ple_bench.run.loop import order_cases

# two groups sharing two tables (the same rows pinned by torch's allocator and exactly), as the
# default suite's production-table groups do; the kernel and the token count vary within a table
SUITE = """
[suite]
description = "two groups, two shared tables"
[defaults]
impl = "pinned_uva"
vocab_size = 4096
dim = 160
dtype = "fp8"
num_heads = 4
host_alloc = ["torch", "exact"]
[[group]]
name = "decode"
num_tokens = 8
kernel = ["", "torch_uva"]
[[group]]
name = "prefill"
num_tokens = 16
kernel = ["", "torch_uva"]
"""


def _policy() -> TimingPolicy:
    return TimingPolicy(warmup_ms=0.0, min_samples=1, max_samples=2, min_time_s=0.0, max_time_s=0.05, id_sets=2)


def _table_runs(cases: list[Case]) -> list[tuple]:
    """The table of each stretch of consecutive cases that share one (a table built per stretch)."""
    return [key for key, _ in itertools.groupby(c.table_key for c in cases)]


def test_groups_sharing_a_table_build_it_once(tmp_path):
    path = tmp_path / "shared.toml"
    path.write_text(SUITE)
    cases = load_suite(path).cases
    assert len(cases) == 8 and len({c.table_key for c in cases}) == 2
    assert len(_table_runs(cases)) > 2  # in the suite's own order the two allocations alternate
    ex = CaseExecutor(device=torch.device("cpu"))
    records = [ex.run(case, _policy()) for case in order_cases(cases)]
    ex.release_table()
    built = [r for r in records if r["table_reused"] is False]
    assert [r["host_alloc_note"] != built[0]["host_alloc_note"] for r in built] == [False, True]
    assert len(built) == 2  # one torch block, one exact mapping; the six other cases reuse them


def test_the_default_suite_builds_each_table_once():
    cases = order_cases(load_suite("default").cases)
    runs = _table_runs(cases)
    assert len(runs) == len(set(runs)), "a table's cases are split: it would be built twice"
    # the 47.7 GiB table: both allocations, each one stretch, torch's allocator first
    production = [key for key in runs if key[3] == 320_001_536 and key[7] == "pinned_uva"]
    assert [key[8] for key in production] == ["torch", "exact"]
    # the big host tables by size (8 GiB .. 100 GiB): each is freed before a bigger one is pinned
    host = [c.table_bytes for c in cases if c.impl != "device" and c.table_bytes >= 4 << 30]
    assert host == sorted(host) and len(set(host)) == 4


def test_paths_on_the_same_rows_share_one_filled_table():
    """pinned_uva, the CPU gather, the copy engines and the hot cache read the same pinned rows: the
    next path takes the filled table over (not pinned, not filled again), its outputs checked byte for
    byte by the executor's gate; an exact mapping is freed once, when the last path lets go of it."""
    base = dict(vocab_size=4096, dim=160, dtype="fp8", num_heads=4, num_tokens=8, host_alloc="exact")
    cases = [Case(impl=impl, **base) for impl in ("pinned_uva", "pinned_cpu_gather", "pinned_copy_engine")]
    cases.append(Case(impl="pinned_hot_cache", cache_rows=64, **base))
    cases.append(Case(impl="device", **{**base, "host_alloc": "torch"}))  # another place: its own table
    ex = CaseExecutor(device=torch.device("cpu"))
    ordered = order_cases(cases)
    assert [c.impl for c in ordered] == ["device", "pinned_copy_engine", "pinned_cpu_gather",
                                         "pinned_hot_cache", "pinned_uva"]
    records, allocations = [], []
    for case in ordered:
        records.append(ex.run(case, _policy()))
        allocations.append(ex.table.backend.host_allocation)
    assert [r["table_reused"] for r in records[1:]] == [False, True, True, True]
    first = allocations[1]
    assert all(a is first for a in allocations[1:]) and not first.freed  # handed over, never freed
    ex.release_table()
    assert first.freed


def test_a_table_of_other_rows_is_built_anew():
    ex = CaseExecutor(device=torch.device("cpu"))
    base = dict(impl="pinned_uva", vocab_size=4096, dim=160, dtype="fp8", num_heads=4, num_tokens=8)
    ex.run(Case(**base), _policy())
    first = ex.table.backend.host_allocation
    for other in (dict(seed=1), dict(host_alloc="exact"), dict(vocab_size=2048)):
        rec = ex.run(Case(**{**base, **other, "impl": "pinned_cpu_gather"}), _policy())
        assert rec["table_reused"] is False, other
        assert ex.table.backend.host_allocation is not first


def test_default_suite_puts_the_47_7_gib_torch_table_right_after_the_32_gib_one():
    """Both tables take a 64 GiB block from torch's allocator: with no other pinned table
    between them in the runner's order, the 47.7 GiB table takes the 32 GiB table's block from
    torch's cache (executor: host_alloc.cached_table_block) instead of pinning 64 GiB again."""
    from ple_bench.backends import get_backend
    from ple_bench.backends.cuda import host_alloc
    from ple_bench.run.loop import order_cases
    from ple_bench.spec.suite import load_suite

    order = order_cases(load_suite("default").cases)
    in_host = [c for c in order if get_backend(c.impl).table_in_host_memory]
    blocks = [(c.vocab_size, c.host_alloc) for c in in_host]
    first_47 = blocks.index((320_001_536, "torch"))
    assert blocks[first_47 - 1] == (214_748_364, "torch")
    # the 32 GiB table's allocation (its rows padded: 34 359 746 560 B in the H200 records) and
    # the 47.7 GiB one round up to the same block
    for size in (34_359_746_560, 320_001_536 * 160):
        assert host_alloc.host_table_bytes(size, "torch") == 64 << 30


def test_a_case_runs_the_same_kernel_alone_and_after_another_case_on_its_table():
    """The kernel a case runs does not depend on the cases before it: a ``device`` case that names no
    kernel runs the backend's CPU kernel (``cpu_kernel``) on a fresh table and on a table the case before
    it filled with another kernel (the engine swaps the kernel, keeping the rows)."""
    base = dict(impl="device", vocab_size=4096, dim=160, dtype="fp8", num_heads=4, num_tokens=8)
    default, other = Case(**base), Case(kernel="torch_uva", **base)
    assert default.table_key == other.table_key
    alone = CaseExecutor(device=torch.device("cpu")).run(default, _policy())
    ex = CaseExecutor(device=torch.device("cpu"))
    first = ex.run(other, _policy())
    after = ex.run(default, _policy())
    assert ex.table.uses == 2  # the second case ran on the first case's filled table
    ex.release_table()
    assert first["kernel_ran"] == "torch_uva"
    expected = get_backend("device").cpu_kernel
    assert expected != get_backend("device").default_kernel  # the two rules would differ here
    assert alone["kernel_ran"] == after["kernel_ran"] == expected
