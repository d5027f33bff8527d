"""The capture window for external profilers (Nsight Systems ``--capture-range
=cudaProfilerApi``, Nsight Compute ``--profile-from-start off``).

``set_profiler_window(True)`` (the runner does so for the ``profile`` verb) makes
:func:`profiler_window` call ``cudaProfilerStart`` / ``cudaProfilerStop``
(through ``torch.cuda.profiler``) around its body, after draining the GPU so
the window holds exactly the enclosed work.  Otherwise, and always on a
machine without CUDA, it is a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .. import annotate as _annotate

_enabled = False


def set_profiler_window(flag: bool) -> None:
    global _enabled
    _enabled = bool(flag)


def profiler_window_enabled() -> bool:
    return _enabled


def _active() -> bool:
    return _enabled and torch.cuda.is_available()


@contextlib.contextmanager
def profiler_window() -> Iterator[bool]:
    """``with profiler_window() as on:`` -- ``on`` says whether the window opened."""
    if not _active():
        yield False
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield True
    finally:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


@contextlib.contextmanager
def windows_suspended() -> Iterator[None]:
    """No profiler window and no torch trace window opens inside: for measurements that
    are not the case's (its ceilings), so that ``--profile-window`` / ``--torch-trace``
    (and ncu / nsys behind them) see the case's sampling phases only."""
    global _enabled, _torch_trace
    saved = (_enabled, _torch_trace)
    _enabled, _torch_trace = False, None
    try:
        yield
    finally:
        _enabled, _torch_trace = saved


# ------------------------------------------------------ torch.profiler (Kineto)
#: samples a torch trace window records by default (``run --torch-trace`` without N)
DEFAULT_TORCH_TRACE_SAMPLES = 10


class TorchTrace:
    """The torch.profiler windows of one case, merged into one Chrome trace.

    Every sampling phase (:func:`torch_trace_window`) is one ``torch.profiler``
    session (CPU activity, and CUDA where there is a GPU) recording at most
    ``max_samples`` samples: a sampling batch that would pass them is split in
    two, the profiler stops after the first part, the rest of the phase runs
    unprofiled.  :meth:`write` merges
    the sessions' events (one process, one clock) into one trace JSON."""

    def __init__(self, max_samples: int = DEFAULT_TORCH_TRACE_SAMPLES) -> None:
        if max_samples < 1:
            raise ValueError("a torch trace records at least one sample per window")
        self.max_samples = int(max_samples)
        self.header: dict | None = None
        self.events: list[dict] = []
        self.windows: list[dict] = []
        self._seen_meta: set[str] = set()

    def add(self, prof, label: str, samples: int) -> None:
        fd, tmp = tempfile.mkstemp(prefix="ple_bench-trace-", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            with open(tmp, encoding="utf-8") as fh:
                data = json.load(fh)
        finally:
            os.unlink(tmp)
        events = data.pop("traceEvents", [])
        shift_us = 0.0
        if self.header is None:
            self.header = data
        else:  # a later session on another time base: move its events onto the first one's
            base, mine = self.header.get("baseTimeNanoseconds"), data.get("baseTimeNanoseconds")
            if isinstance(base, (int, float)) and isinstance(mine, (int, float)):
                shift_us = (mine - base) / 1e3
        for ev in events:
            if ev.get("ph") == "M":  # process / thread names: once is enough
                key = json.dumps([ev.get("name"), ev.get("pid"), ev.get("tid"), ev.get("args")],
                                 sort_keys=True, default=str)
                if key in self._seen_meta:
                    continue
                self._seen_meta.add(key)
            if shift_us and isinstance(ev.get("ts"), (int, float)):
                ev["ts"] = ev["ts"] + shift_us
            self.events.append(ev)
        self.windows.append({"label": label, "samples": samples, "events": len(events)})

    def write(self, path) -> Path | None:
        """Write the merged trace (``None`` and nothing written if no window recorded)."""
        if self.header is None:
            return None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        out = dict(self.header)
        out["traceName"] = str(path)
        out["ple_bench"] = {"windows": self.windows, "max_samples_per_window": self.max_samples}
        out["traceEvents"] = self.events
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        tmp.replace(path)
        return path


_torch_trace: TorchTrace | None = None


def set_torch_trace(max_samples: int | None) -> TorchTrace | None:
    """Start collecting torch.profiler windows (``max_samples`` per window), or stop (``None``).
    Returns the new collection; whatever was collected before is dropped."""
    global _torch_trace
    _torch_trace = TorchTrace(max_samples) if max_samples else None
    return _torch_trace


def torch_trace() -> TorchTrace | None:
    return _torch_trace


def _identity(take_batch):
    return take_batch


@contextlib.contextmanager
def torch_trace_window(label: str) -> Iterator:
    """Around a sampling phase: ``with torch_trace_window(label) as wrap:`` then
    ``run_sampling(wrap(take_batch), ...)``.  Without a torch trace (the normal
    case) ``wrap`` is the identity and nothing else happens.  With one, the
    phase is recorded by ``torch.profiler`` -- with the phase ranges of
    :func:`ple_bench.annotate.annotate` as ``record_function`` ranges, inside a
    ``measurement <label>`` range -- until ``max_samples`` samples are in."""
    trace = _torch_trace
    if trace is None:
        yield _identity
        return


    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    state = {"on": False, "samples": 0}
    window_range = record_function(f"measurement {label}")

    def stop() -> None:
        if not state["on"]:
            return
        state["on"] = False
        _annotate.set_torch_ranges(False)
        try:
            if cuda:
                torch.cuda.synchronize()
        finally:
            window_range.__exit__(None, None, None)
            prof.stop()

    def wrap(take_batch):
        def recorded(k: int):
            if not state["on"]:
                return take_batch(k)
            # a batch that would pass the limit is split: its first part recorded, the rest not
            first = min(k, trace.max_samples - state["samples"])
            samples, mhz = take_batch(first)
            state["samples"] += len(samples)
            if state["samples"] >= trace.max_samples:
                stop()
            if first < k:
                rest, _ = take_batch(k - first)
                samples = list(samples) + list(rest)
            return samples, mhz
        return recorded

    if cuda:
        torch.cuda.synchronize()
    prof.start()
    window_range.__enter__()
    _annotate.set_torch_ranges(True)
    state["on"] = True
    try:
        yield wrap
    except BaseException:
        _annotate.set_torch_ranges(False)
        with contextlib.suppress(Exception):  # keep what was recorded; the phase's error stands
            stop()
            trace.add(prof, label, state["samples"])
        raise
    stop()
    trace.add(prof, label, state["samples"])


def torch_trace_name(case_id: str, rank: int = 0) -> str:
    """The file name of a case's torch.profiler trace in its run folder (``run --torch-trace``)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in case_id)
    return f"trace_{safe}.json" if rank == 0 else f"trace_{safe}.rank{rank}.json"


@contextlib.contextmanager
def torch_trace_case(path, max_samples: int | None) -> Iterator[TorchTrace | None]:
    """Collect the torch trace windows of one case and write them to ``path`` at its
    end (also when it fails: the windows recorded so far); no-op for ``None``."""
    if not max_samples:
        yield None
        return
    trace = set_torch_trace(max_samples)
    try:
        yield trace
    except BaseException:
        set_torch_trace(None)
        with contextlib.suppress(Exception):  # the case's error stands
            trace.write(path)
        raise
    set_torch_trace(None)
    trace.write(path)
