"""The native host gather (ple_bench/backends/cuda/native/host_gather.cpp) on a GPU machine: a bad call
returns its failure value and names its error, ``native_error`` turns it into IndexError /
ValueError, and the CPU gather backend raises it -- nothing crashes, and the next good lookup
gives the right rows.

Why a test: the module's first version threw C++ exceptions from its own code, and on the lent
H200 image every such throw killed the process with a segmentation fault while the same error
thrown inside libtorch reached Python
(docs/gpu-logs/2026-12-01-h200-cpu-gather-row-loop/05-native-errors-segfault.log); the module
now returns its errors (06-native_errors-and-paired.log and 08-native-final.log there: every
case as expected). Public API only: ``new_host_gather`` / ``native_error`` and the backend."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import get_backend
from ple_bench.backends.cuda.native import host_gather_module, native_error, new_host_gather

pytestmark = pytest.mark.gpu

VOCAB, ROW, HEADS, TOKENS = 1 << 16, 160, 16, 64


@pytest.fixture(scope="module")
def built():
    if host_gather_module() is None:
        pytest.skip("the native host gather is not built here (no compiler / ninja, or PLE_BENCH_NATIVE=0)")


def _host_gather():
    table = torch.arange(VOCAB * ROW, dtype=torch.int64).remainder(251).to(torch.uint8).view(VOCAB, ROW)
    return table, new_host_gather(table, torch.uint8, "cpu", HEADS * ROW, 16, 0, 0, 0, 0)


def _failed(got) -> bool:
    return got is None or (isinstance(got, float) and got < 0)


@pytest.mark.parametrize("grain", [64, 0], ids=["row_loop", "index_select"])
@pytest.mark.parametrize("bad", [VOCAB, -1], ids=["past_the_table", "negative"])
def test_a_bad_id_is_returned_as_an_index_error(built, grain, bad):
    table, g = _host_gather()
    assert g.configure(grain)
    ids = torch.randint(0, VOCAB, (TOKENS, HEADS))
    ids[TOKENS // 2, 3] = bad
    got = g.rows(ids, torch.empty(TOKENS, HEADS * ROW, dtype=torch.uint8), 0)
    assert _failed(got) and isinstance(native_error(g), IndexError), (got, native_error(g))
    good = torch.randint(0, VOCAB, (TOKENS, HEADS))  # the same object still works
    out = torch.empty(TOKENS, HEADS * ROW, dtype=torch.uint8)
    assert not _failed(g.rows(good, out, 0))
    assert torch.equal(out, table.index_select(0, good.view(-1)).view(TOKENS, -1))


def test_bad_arguments_are_returned_as_value_errors(built):
    _, g = _host_gather()
    ids = torch.randint(0, VOCAB, (TOKENS, HEADS))
    assert _failed(g.rows(ids, torch.empty(TOKENS, HEADS * ROW + 1, dtype=torch.uint8), 0))  # wrong size
    assert isinstance(native_error(g), ValueError)
    assert _failed(g.rows(ids.float(), torch.empty(TOKENS, HEADS * ROW, dtype=torch.uint8), 0))  # float ids
    assert isinstance(native_error(g), ValueError)
    assert not g.configure(-1) and isinstance(native_error(g), ValueError)


def test_the_cpu_gather_raises_and_keeps_working(built):
    b = get_backend("pinned_cpu_gather")(VOCAB, ROW, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device="cuda")
    b.fill_synthetic(1, scale=0.5)
    ids = torch.randint(0, VOCAB, (TOKENS, HEADS))
    b.lookup(ids)
    b.lookup(ids)  # the second call takes the direct path's one-closure lookup
    for bad in (VOCAB, -1):
        with pytest.raises(IndexError):
            b.lookup(torch.full((TOKENS, HEADS), bad, dtype=torch.int64))
    got = b.lookup(ids)
    torch.cuda.synchronize()
    rows = b.weight.view(torch.uint8).view(VOCAB, -1)
    assert torch.equal(got.view(torch.uint8).cpu(), rows.index_select(0, ids.view(-1)).view(TOKENS, -1))
    b.close()
