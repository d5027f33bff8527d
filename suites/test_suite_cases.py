"""One pytest-benchmark benchmark per case of a suite (see conftest.py and
docs/pytest-benchmark.md).

Each test, in this process, on ple_bench's engine:

1. multi-rank cases are skipped (they need ``torchrun`` / ``python -m ple_bench run``);
2. :meth:`CaseExecutor.run` builds (or reuses) the table, makes the ids, passes the
   correctness gate (bit-exact against the synthetic reference, outputs poisoned)
   and measures the case with :func:`ple_bench.measure.measure` -- ``SkipCase`` ->
   skipped, ``InvalidCase`` -> failed (a wrong result is never timed);
3. ``benchmark.pedantic`` times the engine's own timed callable of the case
   (:func:`ple_bench.run.bench.bench_target`: the lookup, the lookup's graph replays, or
   the decode step with its id refill, rotating through the same id sets as the engine),
   one call per round: on CUDA, where the engine times synchronized calls on the host
   clock (``host_sync``), the round is the engine's own sample
   (:class:`ple_bench.measure.SyncedCall`), elsewhere the call followed by
   ``torch.cuda.synchronize()``; the L2 flush and the sync before each round are
   pedantic's untimed ``setup``, as they are outside the engine's sample
   (``extra_info["timer"] = "host+sync"``; ``"host"`` on a CPU); the rounds are
   warmed up as the engine warms up (the policy's ``warmup_ms`` of calls, at least one;
   ``extra_info["warmup_calls"]``) unless ``--ple-warmup-rounds`` says otherwise;
4. ``benchmark.extra_info`` gets the case axes and the engine's own measurement
   (``engine_median_ms``, ``engine_samples_ms``, ``engine_timer`` = cuda_event,
   host_sync or host_monotonic, ``engine_event_median_ms`` = the CUDA-event median of a
   host_sync measurement, and the record's other scalar fields prefixed ``engine_``);
   ``benchmark.group`` is ``<suite>/<kind>``.
"""

from __future__ import annotations

import statistics

import pytest

from ple_bench.run.bench import bench_target
from ple_bench.run.executor import case_grid_cap
from ple_bench.run.outcome import InvalidCase, SkipCase


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

    with case_grid_cap(case, executor.table.backend):
        try:
            target = bench_target(executor, case, ple_session.policy)
        except SkipCase as exc:
            pytest.skip(str(exc))
        except InvalidCase as exc:
            pytest.fail(f"invalid: {exc}", pytrace=False)
        try:
            benchmark.group = f"{ple_session.suite.name}/{case.kind}"
            benchmark.extra_info.update(
                suite=ple_session.suite.name, case_id=case.case_id, mode=ple_session.mode,
                timer=target.timer, id_sets=target.id_sets, timed=target.timed, cold_l2=target.cold_l2,
                **case.axes(),
                **_engine_fields(rec),
            )
            warmup_rounds = ple_session.warmup_rounds
            if warmup_rounds is None:  # the engine's warm-up, through the engine's code
                benchmark.extra_info["warmup_calls"] = target.warm_up()
                warmup_rounds = 0
            benchmark.pedantic(target.target, setup=target.setup, rounds=ple_session.rounds,
                               warmup_rounds=warmup_rounds, iterations=1)
            target.finish()
            events = target.event_ms[warmup_rounds:]  # pedantic's own warm-up rounds are not timed
            if events:  # host_sync: the GPU time of the rounds pytest-benchmark timed
                benchmark.extra_info["event_median_ms"] = float(statistics.median(events))
        finally:
            target.close()
