"""What one round of ``pytest suites/`` (pytest-benchmark's ``benchmark.pedantic``) runs for a
case: the engine's own timed callable, prepared as the engine prepares each of its samples.

The engine and pytest-benchmark are two host clocks around one piece of code, never two copies
of it:

* a lookup: :meth:`CaseExecutor.lookup_fn` (``start_prefetch`` + ``finalize``, or ``lookup``,
  on the next id set), or for ``graph = "full"`` one captured graph per id set replayed in turn,
  as :func:`ple_bench.measure.measure_graph` replays them;
* a step: the case's :class:`~ple_bench.run.step.DecodeStep` built by
  :func:`~ple_bench.run.step.step_for_case`, timed through
  :class:`~ple_bench.run.step.StepFeed` (the next id set copied into the static input, then the
  step in its graph mode) -- the callable every step sample of the engine times;
* on CUDA, where the engine times synchronized calls on the host clock (``host_sync``: a
  host-blocking path, or a step with host ids) the round is the engine's sample itself,
  :class:`~ple_bench.measure.timer.SyncedCall` (``run`` timed, ``prepare`` -- the L2 flush where
  the engine flushed, and the sync -- as the untimed setup); elsewhere the callable followed by a
  device sync, with the same untimed flush before it.  On a CPU the callable alone (the engine's
  CPU timer calls it alone too);
* warmed up as the engine warms up each measurement (:meth:`BenchTarget.warm_up`: the policy's
  ``warmup_ms`` of calls, at least one, through :func:`ple_bench.measure.warm_up`), so that both
  clocks sample the same state of the path (a suite with ``warmup_ms = 0``, as ``smoke``, samples
  its first calls on both).

:func:`bench_target` raises :class:`~ple_bench.run.outcome.SkipCase` where the engine would skip
and :class:`~ple_bench.run.outcome.InvalidCase` for a wrong result (never timed)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .. import measure as m
from ..measure.l2 import get_flusher
from ..parallel import Topology
from . import step as step_mod
from .executor import CaseExecutor
from .outcome import InvalidCase, SkipCase

#: a step rotates through at least this many id sets when the policy gives fewer (as the engine does)
STEP_MIN_ID_SETS = 8


@dataclasses.dataclass
class BenchTarget:
    """One case's pedantic round: ``target`` is timed, ``setup`` runs untimed before each round;
    ``close`` releases what the target holds (graphs, the step)."""

    target: Callable[[], Any]
    setup: Callable[[], None] | None
    close: Callable[[], None]
    timer: str  # "host+sync" on CUDA, "host" on a CPU: pytest-benchmark's clock around the round
    engine_timer: str  # the engine's timer of the case: host_sync, cuda_event or host_monotonic
    timed: str  # "decode step", "lookup" or "lookup graph replay"
    id_sets: int
    cold_l2: bool  # the L2 is flushed before each round, as before each of the engine's samples
    warmup_ms: float = 0.0  # the engine's warm-up of the case's measurements (its policy's warmup_ms)
    #: host_sync rounds: the CUDA events' time of each timed round (read in the next round's untimed
    #: setup, the last one by :meth:`finish`): the GPU time of the very calls the host clock timed
    event_ms: list[float] = dataclasses.field(default_factory=list)
    finish: Callable[[], None] = lambda: None

    def one_round(self) -> None:
        """One round, its setup included (a warm-up call)."""
        if self.setup is not None:
            self.setup()
        self.target()

    def warm_up(self) -> int:
        """Warm the target up as the engine warms up each measurement
        (:func:`ple_bench.measure.warm_up`: ``warmup_ms`` of wall time, at least one call);
        returns the calls made.  Every round ends complete (a CUDA round syncs), so there is
        nothing more to wait for between calls."""
        calls, _ = m.warm_up(self.one_round, lambda: None, self.warmup_ms)
        self.finish()
        self.event_ms.clear()  # the warm-up's rounds are not the timed ones
        return calls


def engine_times_host_sync(case, backend) -> bool:
    """Whether the engine times ``case`` as synchronized calls on the host clock."""
    if case.kind == "step":
        return step_mod.step_timed_host_sync(case, backend)
    return bool(type(backend).blocks_host)


def _lookup_callable(executor: CaseExecutor, case, backend, id_sets) -> tuple[Callable[[], Any], Callable[[], None]]:
    if case.graph == "full":
        graphs = [m.capture_graph(executor.lookup_fn(case, backend, s, None), executor.device,
                                  label="lookup_graph") for s in id_sets]
        turn = [0]

        def replay() -> None:
            graphs[turn[0] % len(graphs)].replay()
            turn[0] += 1
        return replay, graphs.clear
    return executor.lookup_fn(case, backend, id_sets, None), lambda: None


def _step_callable(executor: CaseExecutor, case, backend, id_sets) -> tuple[Callable[[], Any], Callable[[], None]]:
    sets = step_mod.placed_id_sets(case, backend, id_sets, executor.device)
    step = step_mod.step_for_case(case, backend, sets[0].shape[0], executor.device)
    try:
        step_mod.check_step(step, sets, executor.table.seed)
    except NotImplementedError as exc:
        step.close()
        raise SkipCase(f"decode step not timed here: {exc}") from exc
    except step_mod.StepMismatch as exc:
        step.close()
        raise InvalidCase(str(exc)) from exc
    return step_mod.StepFeed(step, sets).timed(step.runner("step")), step.close


def bench_target(executor: CaseExecutor, case, policy) -> BenchTarget:
    """The round of ``case`` after the engine has run it on ``executor`` (its table, its id
    sets: the same seeds in the same order).  Build and time it under
    ``case_grid_cap(case, executor.table.backend)``, as the engine measures under it."""
    if case.world_size > 1:
        raise SkipCase(f"multi-rank case (tp={case.tp} etp={case.etp} dp={case.dp}: {case.world_size} ranks); "
                       "pytest runs one rank in-process -- use `python -m ple_bench run` for it")
    topo = Topology(case.tp, case.etp, case.dp)
    backend = executor.table.backend
    device = executor.device
    id_sets = executor.id_sets_for(case, topo, getattr(policy, "id_sets", 1))
    if case.kind == "step" and len(id_sets) < 2:
        id_sets = executor.id_sets_for(case, topo, STEP_MIN_ID_SETS)
    if case.kind == "step":
        fn, close = _step_callable(executor, case, backend, id_sets)
    else:
        fn, close = _lookup_callable(executor, case, backend, id_sets)
    host_sync = engine_times_host_sync(case, backend)
    timed = "decode step" if case.kind == "step" else ("lookup graph replay" if case.graph == "full" else "lookup")
    n_sets = 1 if (case.kind == "lookup" and case.graph == "full") else len(id_sets)
    warmup_ms = float(getattr(policy, "warmup_ms", 0.0))
    if device.type != "cuda":
        return BenchTarget(fn, None, close, "host", "host_monotonic", timed, n_sets, False, warmup_ms)
    # the engine's primary measurement of a lookup flushes the L2 before each sample when the
    # policy says so (eager and graph alike); a step's never does
    cold = case.kind == "lookup" and bool(getattr(policy, "cold_l2", False))
    flusher = get_flusher(device) if cold else None
    if host_sync:
        call = m.SyncedCall(device, fn, flusher=flusher)
        ran = [False]

        def run() -> None:
            call.run()
            ran[0] = True

        def keep_events() -> None:  # untimed: the events of the round just timed
            if ran[0]:
                target.event_ms.append(call.last_event_ms)
                ran[0] = False

        def setup() -> None:
            keep_events()
            call.prepare()

        target = BenchTarget(run, setup, close, "host+sync", "host_sync",
                             timed, n_sets, flusher is not None, warmup_ms, finish=keep_events)
        return target

    def synced() -> None:
        fn()
        torch.cuda.synchronize(device)

    def prepare() -> None:
        if flusher is not None:
            flusher.flush()
        torch.cuda.synchronize(device)
    return BenchTarget(synced, prepare, close, "host+sync", "cuda_event", timed, n_sets,
                       flusher is not None, warmup_ms)

