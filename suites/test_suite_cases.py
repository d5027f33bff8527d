"""One pytest-benchmark benchmark per case of a suite (see conftest.py and
docs/pytest-benchmark.md).

Each test, in this process, on ple_bench's engine:

1. multi-rank cases are skipped (they need ``torchrun`` / ``python -m ple_bench run``);
2. :meth:`CaseExecutor.run` builds (or reuses) the table, makes the ids, passes the
   correctness gate (bit-exact against the synthetic reference, outputs poisoned)
   and measures the case with :func:`ple_bench.measure.measure` -- ``SkipCase`` ->
   skipped, ``InvalidCase`` -> failed (a wrong result is never timed);
3. ``benchmark.pedantic`` times the same lookup (or the decode step of a
   ``kind="step"`` case), rotating through the same id sets as the engine (policy
   ``id_sets``; a graph replay repeats the first set), one call per round followed
   by ``torch.cuda.synchronize()``
   on CUDA, so pytest-benchmark's host timer sees completed GPU work
   (``extra_info["timer"] = "host+sync"``; ``"host"`` on a CPU);
4. ``benchmark.extra_info`` gets the case axes and the engine's own measurement
   (``engine_median_ms``, ``engine_samples_ms``, ``engine_timer`` = cuda_event or
   host_monotonic, ``engine_event_median_ms`` = the CUDA-event median of a host_sync
   measurement, and the record's other scalar fields prefixed ``engine_``);
   ``benchmark.group`` is ``<suite>/<kind>``.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from ple_bench.run.executor import _grid_cap
from ple_bench.run.outcome import InvalidCase, SkipCase
from ple_bench.parallel import Topology

#: a step rotates through at least this many id sets when the policy gives fewer
#: (as CaseExecutor._run_step does: fresh rows each step)
STEP_MIN_ID_SETS = 8


def _engine_fields(rec: dict) -> dict:
    out = {"engine_samples_ms": [float(v) for v in rec.get("samples_ms") or []]}
    events = rec.get("event_samples_ms") or rec.get("step_event_samples_ms")
    if events:  # host_sync timer: the GPU time of the engine's calls (CUDA events around each)
        out["engine_event_median_ms"] = float(statistics.median(events))
    for key, value in rec.items():
        if key == "samples_ms" or key.endswith("_samples_ms"):
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            out[f"engine_{key}"] = value
    return out


def _sync_after(fn, device: torch.device):
    if device.type != "cuda":
        return fn

    def timed():
        out = fn()
        torch.cuda.synchronize(device)
        return out
    return timed


def _lookup_target(executor, case, backend, id_sets):
    from ple_bench import measure as m

    if case.graph == "full":
        # the engine timed graph replays; so do we: a graph bakes in its ids, so one graph per
        # id set, replayed in turn
        graphs = [m.capture_graph(executor._lookup_fn(case, backend, s, None), executor.device,
                                  label="lookup_graph") for s in id_sets]
        turn = [0]

        def replay():
            graphs[turn[0] % len(graphs)].replay()
            turn[0] += 1
        return replay, None
    return executor._lookup_fn(case, backend, id_sets, None), None  # one id set per call, in turn


def _step_target(executor, case, backend, sets):
    from ple_bench.run import step as step_mod

    step = step_mod.DecodeStep(backend, hidden=case.hidden, num_tokens=case.num_tokens,
                               compute_us=case.compute_us, prefetch=case.prefetch, graph=case.graph,
                               device=executor.device, ids_on=case.ids_on)
    try:
        step_mod.check_step(step, sets, executor.table.seed)
    except NotImplementedError as exc:
        step.close()
        pytest.skip(f"decode step not timed here: {exc}")
    except step_mod.StepMismatch as exc:
        step.close()
        pytest.fail(f"invalid: {exc}", pytrace=False)
    run = step.runner("step")
    position = [0]

    def fn():
        step.set_inputs(sets[position[0] % len(sets)])
        position[0] += 1
        return run()
    return fn, step.close


def test_case(benchmark, ple_case, ple_session):
    case = ple_case
    if case.world_size > 1:
        pytest.skip(f"multi-rank case (tp={case.tp} etp={case.etp} dp={case.dp}: {case.world_size} ranks); "
                    "pytest runs one rank in-process -- use `python -m ple_bench run` for it")
    executor = ple_session.executor()
    try:
        rec = executor.run(case, ple_session.policy)
    except SkipCase as exc:
        pytest.skip(str(exc))
    except InvalidCase as exc:
        pytest.fail(f"invalid (wrong result, not timed): {exc}", pytrace=False)

    topo = Topology(case.tp, case.etp, case.dp)
    backend = executor.table.backend
    device = executor.device
    # the id sets the engine rotated through (CaseExecutor.run): same seeds, same order
    id_sets = executor.id_sets_for(case, topo, getattr(ple_session.policy, "id_sets", 1))
    if case.kind == "step" and len(id_sets) < 2:
        id_sets = executor.id_sets_for(case, topo, STEP_MIN_ID_SETS)
    with _grid_cap(case, backend):
        if case.kind == "step":
            fn, cleanup = _step_target(executor, case, backend, id_sets)
        else:
            fn, cleanup = _lookup_target(executor, case, backend, id_sets)
        try:
            benchmark.group = f"{ple_session.suite.name}/{case.kind}"
            benchmark.extra_info.update(
                suite=ple_session.suite.name, case_id=case.case_id, mode=ple_session.mode,
                timer="host+sync" if device.type == "cuda" else "host",
                id_sets=1 if (case.kind == "lookup" and case.graph == "full") else len(id_sets),
                timed="decode step" if case.kind == "step" else
                      ("lookup graph replay" if case.graph == "full" else "lookup"),
                **case.axes(),
                **_engine_fields(rec),
            )
            benchmark.pedantic(_sync_after(fn, device), rounds=ple_session.rounds,
                               warmup_rounds=ple_session.warmup_rounds, iterations=1)
        finally:
            if cleanup is not None:
                cleanup()
