"""Our breakable CUDA graph: a step captured as graph segments separated by
*eager breaks*, replayed in order.

While a step is being captured in ``"breakable"`` mode, a call to a function
marked with :func:`eager_break` ends the current graph segment, runs the
function eagerly on the capture stream, records the call as a replay step, and
begins a new segment in the same memory pool.  :meth:`BreakableGraph.replay`
then runs segments and recorded calls in capture order.

A recorded call is bound to exactly what it was called with at capture: the
callable itself (for a method, the bound object) and its arguments, held by
*strong* references.  Replay never looks anything up by name or key -- a
registry-keyed replay once made one layer read another layer's table (see
REFERENCE.md) -- and no argument can be freed while the graph lives, so no
later segment can reuse its pool memory.

A recorded call's return value: if it returned tensors at capture, the later
segments were captured reading *those* tensors, so on replay the fresh result
is copied into them (a call that writes into a static ``out=`` and returns it
costs nothing).  Any other return value is frozen at its capture-time value.

Modes (``MODES``): ``"eager"`` (no graph: replay calls the function again),
``"breakable"`` (segments + eager breaks) and ``"full"`` (one graph, eager-break
functions are plain calls and are captured with the rest).  Outside a capture,
an eager-break function is always a plain call.

The bookkeeping is independent of CUDA: a ``segment_factory(pool)`` returning
objects with ``begin()``, ``end()``, ``replay()`` (and optionally ``empty``)
can replace :class:`CudaSegment` -- the CPU tests use a fake one.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import torch

from ..env import resolve_device

MODES = ("eager", "breakable", "full")


class GraphError(RuntimeError):
    """Misuse of a :class:`BreakableGraph` (nested breaks, replay before capture, ...)."""


class Segment(Protocol):
    """One captured piece of the step (a ``torch.cuda.CUDAGraph`` on a GPU)."""

    def begin(self) -> None: ...

    def end(self) -> None: ...

    def replay(self) -> None: ...


SegmentFactory = Callable[[Any], Segment]


class CudaSegment:
    """A ``torch.cuda.CUDAGraph`` captured on the current stream into ``pool``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.graph = torch.cuda.CUDAGraph()
        self.empty = False

    def begin(self) -> None:
        # thread_local: a host path's own thread (a gather handed off by an eager break
        # just before this segment) may issue copies on its stream while this thread
        # captures; "global" would invalidate the capture for that
        self.graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")

    def end(self) -> None:
        # A segment between two back-to-back breaks captures nothing; torch warns
        # "The CUDA Graph is empty" -- expected here: note it and skip its replay.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.graph.capture_end()
        for w in caught:
            if "graph is empty" in str(w.message).lower():
                self.empty = True
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def replay(self) -> None:
        if not self.empty:
            self.graph.replay()


@dataclass
class EagerCall:
    """A recorded eager break: the callable and arguments it was given at capture
    (strong references), and what it returned then."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    captured_result: Any = None
    name: str = ""

    def run(self) -> None:
        result = self.fn(*self.args, **self.kwargs)
        _refresh(self.captured_result, result, self.name)


def _refresh(static: Any, fresh: Any, name: str) -> None:
    """Copy a replayed break's result into the tensors the later segments read."""
    if isinstance(static, torch.Tensor):
        if not isinstance(fresh, torch.Tensor):
            raise GraphError(f"eager break {name} returned a tensor at capture but {type(fresh)} on replay")
        if fresh is not static and (fresh.data_ptr() != static.data_ptr() or fresh.shape != static.shape):
            static.copy_(fresh)
    elif isinstance(static, (tuple, list)):
        if not isinstance(fresh, (tuple, list)) or len(fresh) != len(static):
            raise GraphError(f"eager break {name} returned a different structure on replay")
        for s, f in zip(static, fresh):
            _refresh(s, f, name)


@dataclass
class _SegmentStep:
    segment: Segment

    def run(self) -> None:
        self.segment.replay()


_state = threading.local()


def capturing_graph() -> "BreakableGraph | None":
    """The graph this thread is capturing now, or ``None``."""
    return getattr(_state, "graph", None)


def eager_break(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` (a function, a method, or an already-bound method) as an eager
    break: during a ``"breakable"`` capture it splits the graph and is replayed
    eagerly with its capture-time arguments; otherwise it is a plain call."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        graph = capturing_graph()
        if graph is None or graph.mode != "breakable":
            return fn(*args, **kwargs)
        return graph._eager_break(fn, args, kwargs)

    wrapper.__eager_break__ = True  # type: ignore[attr-defined]
    return wrapper


def is_eager_break(fn: Any) -> bool:
    return bool(getattr(fn, "__eager_break__", False))


def _name(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    base = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{base} of {type(owner).__name__}@{id(owner):#x}" if owner is not None else base


@dataclass(eq=False)
class BreakableGraph:
    """A step captured once and replayed many times, in one of :data:`MODES`.

    ``segment_factory`` / ``pool_factory`` replace the CUDA ones (for tests);
    without them the graph modes need a CUDA ``device``.  ``stream`` is the
    capture stream (a new side stream by default, as CUDA capture requires a
    non-default stream)."""

    mode: str = "breakable"
    device: torch.device | str | None = None
    segment_factory: SegmentFactory | None = None
    pool_factory: Callable[[], Any] | None = None
    stream: Any = None
    _steps: list = field(default_factory=list, init=False, repr=False)
    _current: Segment | None = field(default=None, init=False, repr=False)
    _in_break: str | None = field(default=None, init=False, repr=False)
    _captured: bool = field(default=False, init=False, repr=False)
    _fn: tuple | None = field(default=None, init=False, repr=False)
    pool: Any = field(default=None, init=False, repr=False)
    outputs: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown graph mode {self.mode!r}; allowed: {MODES}")
        self._cuda = False
        if self.mode != "eager" and self.segment_factory is None:
            device = resolve_device(self.device if self.device is not None else "cuda")
            if device.type != "cuda" or not torch.cuda.is_available():
                raise NotImplementedError(
                    f"graph={self.mode} needs CUDA (CPU functional mode runs eagerly)"
                )
            self.device = device
            self.segment_factory = CudaSegment
            self.pool_factory = self.pool_factory or torch.cuda.graph_pool_handle
            self._cuda = True

    # ------------------------------------------------------------ inspection
    @property
    def captured(self) -> bool:
        return self._captured

    @property
    def segments(self) -> list[Segment]:
        return [s.segment for s in self._steps if isinstance(s, _SegmentStep)]

    @property
    def eager_calls(self) -> list[EagerCall]:
        return [s for s in self._steps if isinstance(s, EagerCall)]

    @property
    def steps(self) -> list[tuple[str, Any]]:
        """Replay order: ``("segment", Segment)`` and ``("eager", EagerCall)``."""
        return [("segment", s.segment) if isinstance(s, _SegmentStep) else ("eager", s)
                for s in self._steps]

    # ------------------------------------------------------------ capture
    def capture(self, fn: Callable[..., Any], *args: Any, warmup: int = 0, **kwargs: Any) -> Any:
        """Capture ``fn(*args, **kwargs)`` (after ``warmup`` eager calls on the
        capture stream) and return what it returned at capture (its static outputs)."""
        self._check_can_capture()
        self._fn = (fn, args, kwargs)
        if self.mode == "eager":
            for _ in range(warmup):
                fn(*args, **kwargs)
            self.outputs = fn(*args, **kwargs)
            self._captured = True
            return self.outputs
        with self._on_capture_stream():
            for _ in range(warmup):
                fn(*args, **kwargs)
            with self.capturing():
                self.outputs = fn(*args, **kwargs)
        return self.outputs

    @contextlib.contextmanager
    def capturing(self) -> Iterator["BreakableGraph"]:
        """``with graph.capturing(): body`` captures ``body`` (on the current
        stream: in CUDA mode use it inside ``torch.cuda.stream(side_stream)``,
        or use :meth:`capture`, which does that)."""
        self._check_can_capture()
        if self.mode == "eager":
            self._captured = True
            yield self
            return
        if self._cuda:
            torch.cuda.synchronize(self.device)
        self.pool = self.pool_factory() if self.pool_factory is not None else None
        self._steps = []
        _state.graph = self
        ok = False
        try:
            self._begin_segment()
            yield self
            self._end_segment()
            ok = True
        finally:
            _state.graph = None
            self._in_break = None
            if not ok:
                self._abort()
        self._captured = True
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def _check_can_capture(self) -> None:
        if self._captured:
            raise GraphError("this graph is already captured; make a new BreakableGraph to capture again")
        active = capturing_graph()
        if active is not None:
            raise GraphError("another BreakableGraph is being captured on this thread")
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise GraphError("the current stream is already capturing a CUDA graph")

    @contextlib.contextmanager
    def _on_capture_stream(self) -> Iterator[None]:
        if not self._cuda:
            yield
            return
        with torch.cuda.device(self.device):
            if self.stream is None:
                self.stream = torch.cuda.Stream(device=self.device)
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                yield
            current.wait_stream(self.stream)

    def _begin_segment(self) -> None:
        segment = self.segment_factory(self.pool)
        segment.begin()
        self._current = segment

    def _end_segment(self) -> None:
        segment, self._current = self._current, None
        if segment is None:
            raise GraphError("no graph segment is open")
        segment.end()
        self._steps.append(_SegmentStep(segment))

    def _abort(self) -> None:
        """Leave capture mode after an error; the graph stays uncaptured."""
        segment, self._current = self._current, None
        if segment is not None:
            try:
                segment.end()
            except Exception:  # the capture may already be invalidated
                pass
        self._steps = []

    def _eager_break(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        name = _name(fn)
        if self._in_break is not None:
            raise GraphError(
                f"eager break {name} called inside eager break {self._in_break}: "
                "nested eager breaks are not supported"
            )
        self._end_segment()
        self._in_break = name
        try:
            result = fn(*args, **kwargs)
        finally:
            self._in_break = None
        self._steps.append(EagerCall(fn, args, dict(kwargs), result, name))
        self._begin_segment()
        return result

    # ------------------------------------------------------------ replay
    def replay(self) -> Any:
        """Run the captured step: segments and eager calls in capture order, on the
        current stream.  Returns the static outputs (in eager mode, fn's new result)."""
        if capturing_graph() is not None:
            raise GraphError("replay() called during a capture")
        if not self._captured:
            raise GraphError("replay() called before capture()")
        if self.mode == "eager":
            if self._fn is None:
                raise GraphError("an eager graph captured with capturing() has nothing to replay")
            fn, args, kwargs = self._fn
            self.outputs = fn(*args, **kwargs)
            return self.outputs
        for step in self._steps:
            step.run()
        return self.outputs

    __call__ = replay
