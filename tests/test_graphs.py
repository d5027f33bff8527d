"""BreakableGraph bookkeeping on CPU, with a fake segment factory that behaves
like CUDA capture: work issued while a segment captures is recorded, not run,
and runs only when the segment is replayed."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import synthetic_rows
from ple_bench.run.graphs import BreakableGraph, GraphError, capturing_graph, eager_break, is_eager_break


class FakeDevice:
    """Segments + "device ops": an op issued during a segment's capture is
    appended to it; otherwise it runs at once.  ``log`` is what actually ran."""

    def __init__(self) -> None:
        self.capturing: "FakeSegment | None" = None
        self.segments: list[FakeSegment] = []
        self.log: list[str] = []

    def factory(self, pool):
        seg = FakeSegment(self, pool)
        self.segments.append(seg)
        return seg

    def op(self, name: str, fn=None) -> None:
        if self.capturing is not None:
            self.capturing.ops.append((name, fn))
            return
        self.log.append(name)
        if fn is not None:
            fn()


class FakeSegment:
    def __init__(self, dev: FakeDevice, pool) -> None:
        self.dev, self.pool, self.ops = dev, pool, []
        self.state = "new"

    def begin(self) -> None:
        assert self.dev.capturing is None, "two segments capturing at once"
        self.state = "capturing"
        self.dev.capturing = self

    def end(self) -> None:
        assert self.dev.capturing is self
        self.dev.capturing = None
        self.state = "ended"

    def replay(self) -> None:
        assert self.state == "ended", "replay of a segment that was not captured"
        for name, fn in self.ops:
            self.dev.log.append(name)
            if fn is not None:
                fn()


def graph(dev: FakeDevice, mode: str = "breakable") -> BreakableGraph:
    return BreakableGraph(mode, segment_factory=dev.factory, pool_factory=object)


def test_segments_and_breaks_replay_in_order_in_one_pool():
    dev = FakeDevice()
    calls = []

    @eager_break
    def brk(tag):
        calls.append(tag)
        dev.op(f"brk-{tag}")  # runs eagerly: not captured into any segment

    def body():
        dev.op("a")
        brk(1)
        dev.op("b")
        brk(2)
        dev.op("c")
        return "static"

    g = graph(dev)
    assert g.capture(body) == "static"
    # during capture only the breaks ran (eagerly); segment work was recorded
    assert dev.log == ["brk-1", "brk-2"]
    assert calls == [1, 2]
    assert [kind for kind, _ in g.steps] == ["segment", "eager", "segment", "eager", "segment"]
    assert len(dev.segments) == 3 and len({id(s.pool) for s in dev.segments}) == 1
    assert all(s.pool is g.pool for s in dev.segments)
    assert [[n for n, _ in s.ops] for s in dev.segments] == [["a"], ["b"], ["c"]]
    dev.log.clear()
    assert g.replay() == "static"
    assert dev.log == ["a", "brk-1", "b", "brk-2", "c"]
    assert calls == [1, 2, 1, 2]  # replayed with the capture-time arguments
    assert is_eager_break(brk)


class Layer:
    """A layer with its own table; ``read`` gathers rows into a static output."""

    def __init__(self, dev: FakeDevice, seed: int, rows: int = 64, dim: int = 8) -> None:
        self.dev = dev
        self.seed = seed
        self.table = synthetic_rows(torch.arange(rows), dim, seed, torch.float32)

    @eager_break
    def read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(self.table[ids])


def test_break_replays_with_its_capture_time_bound_object():
    """Two layers whose breaks are the *same* function (same name, same class):
    each replayed call must read its own layer's table, never one found by key."""
    dev = FakeDevice()
    layers = {"layer1": Layer(dev, seed=11), "layer14": Layer(dev, seed=99)}
    ids = torch.zeros(5, dtype=torch.int64)
    out1 = torch.empty(5, 8)
    out14 = torch.empty(5, 8)

    def body():
        layers["layer1"].read(ids, out1)
        dev.op("mid")
        layers["layer14"].read(ids, out14)

    g = graph(dev)
    g.capture(body)
    eager = g.eager_calls
    assert len(eager) == 2 and eager[0].fn is eager[1].fn  # one function, two bound objects
    assert eager[0].args[0] is layers["layer1"] and eager[1].args[0] is layers["layer14"]

    # the registry is rebound after capture: replay must not care
    layers["layer1"], layers["layer14"] = layers["layer14"], layers["layer1"]
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        fresh = torch.randint(0, 64, (5,), generator=gen)
        ids.copy_(fresh)  # fresh ids into the static input
        out1.fill_(float("nan"))
        out14.fill_(float("nan"))
        g.replay()
        assert torch.equal(out1, synthetic_rows(fresh, 8, 11, torch.float32))
        assert torch.equal(out14, synthetic_rows(fresh, 8, 99, torch.float32))
        assert not torch.equal(out1, out14)


def test_break_keeps_strong_references_to_its_arguments():
    import gc
    import weakref

    dev = FakeDevice()
    sink = torch.zeros(3)

    @eager_break
    def add_into(src, dst):
        dst.add_(src)

    def body():
        tmp = torch.full((3,), 2.0)  # dies when body returns, unless the graph holds it
        add_into(tmp, sink)
        return weakref.ref(tmp)

    g = graph(dev)
    ref = g.capture(body)
    gc.collect()
    assert ref() is not None
    sink.zero_()
    g.replay()
    g.replay()
    assert torch.equal(sink, torch.full((3,), 4.0))


def test_returned_tensor_is_refreshed_into_the_captured_one():
    dev = FakeDevice()
    src = torch.tensor([1.0, 2.0])
    seen = []

    @eager_break
    def fresh_copy():
        return src.clone()  # a new tensor on every call

    def body():
        t = fresh_copy()
        dev.op("consume", lambda: seen.append(t.clone()))  # captured reading the capture-time tensor
        return t

    g = graph(dev)
    g.capture(body)
    src.copy_(torch.tensor([5.0, 7.0]))
    g.replay()
    assert torch.equal(seen[-1], torch.tensor([5.0, 7.0]))


def test_full_mode_captures_the_breaks():
    dev = FakeDevice()

    @eager_break
    def brk():
        dev.op("brk")

    def body():
        dev.op("a")
        brk()
        dev.op("b")

    g = graph(dev, "full")
    g.capture(body)
    assert dev.log == []  # nothing ran at capture: the break was captured too
    assert len(dev.segments) == 1 and g.eager_calls == []
    assert [n for n, _ in dev.segments[0].ops] == ["a", "brk", "b"]
    g.replay()
    assert dev.log == ["a", "brk", "b"]


def test_eager_mode_and_calls_outside_capture_are_plain():
    dev = FakeDevice()
    count = [0]

    @eager_break
    def brk():
        count[0] += 1
        return count[0]

    assert brk() == 1 and capturing_graph() is None
    g = BreakableGraph("eager")
    assert g.capture(brk) == 2
    assert g.replay() == 3 and g.segments == []
    assert dev.segments == []


def test_warmup_runs_eagerly_before_capture():
    dev = FakeDevice()
    g = graph(dev)
    g.capture(lambda: dev.op("w"), warmup=2)
    assert dev.log == ["w", "w"] and [n for n, _ in dev.segments[0].ops] == ["w"]


def test_context_manager_capture():
    dev = FakeDevice()

    @eager_break
    def brk():
        dev.op("brk")

    g = graph(dev)
    with g.capturing():
        dev.op("a")
        brk()
    assert g.captured and [k for k, _ in g.steps] == ["segment", "eager", "segment"]
    dev.log.clear()
    g.replay()
    assert dev.log == ["a", "brk"]


def test_nested_breaks_are_refused():
    dev = FakeDevice()

    @eager_break
    def inner():
        pass

    @eager_break
    def outer():
        inner()

    g = graph(dev)
    with pytest.raises(GraphError, match="nested"):
        g.capture(outer)
    assert not g.captured and capturing_graph() is None
    assert dev.capturing is None  # no segment left capturing
    outer()  # outside capture both are plain calls again


def test_misuse_errors():
    dev = FakeDevice()
    g = graph(dev)
    with pytest.raises(GraphError, match="before capture"):
        g.replay()
    g.capture(lambda: dev.op("x"))
    with pytest.raises(GraphError, match="already captured"):
        g.capture(lambda: None)

    other = graph(dev)
    inner = graph(dev)

    def body():
        with pytest.raises(GraphError, match="another"):
            inner.capture(lambda: None)
        with pytest.raises(GraphError, match="during a capture"):
            g.replay()

    other.capture(body)
    with pytest.raises(ValueError, match="unknown graph mode"):
        BreakableGraph("piecewise", segment_factory=dev.factory)


def test_error_inside_capture_leaves_no_capture_open():
    dev = FakeDevice()

    def body():
        dev.op("a")
        raise KeyError("boom")

    g = graph(dev)
    with pytest.raises(KeyError):
        g.capture(body)
    assert dev.capturing is None and capturing_graph() is None and not g.captured
    with pytest.raises(GraphError):
        g.replay()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_graph_modes_need_cuda_without_a_fake_factory():
    for mode in ("breakable", "full"):
        with pytest.raises(NotImplementedError, match="needs CUDA"):
            BreakableGraph(mode, device="cpu")
    BreakableGraph("eager", device="cpu")  # fine
