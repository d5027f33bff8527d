"""The synthetic decode step on CPU (functional mode): embeddings and output
against references for device / pinned and prefetch on / off, the correctness
gate catching wrong results, and run_step_case's record."""

from __future__ import annotations

import math

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.spec.case import Case
from ple_bench.parallel import Topology
from ple_bench.run.step import DecodeStep, StepMismatch, check_step, run_step_case

VOCAB, DIM, HEADS, TOKENS, HIDDEN, SEED = 3000, 16, 2, 6, 24, 77


def make_backend(impl: str, dtype: str = "fp8"):
    b = get_backend(impl)(VOCAB, DIM, dtype=dtype, num_heads=HEADS, max_tokens=TOKENS, device="cpu")
    b.fill_synthetic(SEED, scale=0.5 if b.format.quantized else None)
    return b


def make_ids(n_sets: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    per = VOCAB // HEADS
    sets = []
    for _ in range(n_sets):
        local = torch.randint(0, per, (TOKENS, HEADS), generator=gen)
        sets.append(local + torch.arange(HEADS) * per)  # each head in its own range
    return sets


def expected_output(step: DecodeStep, ids: torch.Tensor) -> torch.Tensor:
    """The step's output recomputed independently in float64."""
    x = step.hidden_in.double()
    for i in range(step.compute_matmuls):
        x = x @ step.weights[i % len(step.weights)].double()
    rows = synthetic_rows(ids.reshape(-1), DIM, SEED, step.backend.storage_dtype).double()
    scale = float(step.backend.scale) if step.backend.scale is not None else 1.0
    emb = (rows * scale).reshape(TOKENS, HEADS * DIM)
    return x + emb @ step.proj.double()


@pytest.mark.parametrize("impl", ["device", "pinned_uva"])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_step_embeddings_and_output_match_reference(impl, prefetch, dtype):
    backend = make_backend(impl, dtype)
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=3, prefetch=prefetch)
    assert step.act_dtype == torch.float32 and step.compute_matmuls == 3
    for ids in make_ids(3, seed=hash((impl, prefetch, dtype)) % 1000):
        step.set_inputs(ids)
        step.rows.view(torch.uint8).fill_(0x7F)
        step.out.fill_(float("nan"))
        out = step.run()
        ref = synthetic_rows(ids.reshape(-1), DIM, SEED, backend.storage_dtype).reshape(TOKENS, -1)
        assert torch.equal(step.embeddings.view(torch.uint8), ref.view(torch.uint8))
        want = expected_output(step, ids)
        assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    check_step(step, make_ids(2, seed=5), SEED)  # the gate agrees


def test_lookup_and_compute_bodies():
    backend = make_backend("pinned_uva")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=2, prefetch=True)
    ids = make_ids(1, seed=9)[0]
    step.set_inputs(ids)
    step.rows.view(torch.uint8).fill_(0x7F)
    rows = step.run_lookup()
    ref = synthetic_rows(ids.reshape(-1), DIM, SEED, torch.float8_e4m3fn).reshape(TOKENS, -1)
    assert torch.equal(rows.view(torch.uint8), ref.view(torch.uint8))
    step.out.fill_(float("nan"))
    out = step.run_compute()  # consumer over the rows already there
    want = expected_output(step, ids)
    assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_gate_catches_a_wrong_table_row():
    backend = make_backend("pinned_uva")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, prefetch=True)
    ids = make_ids(1, seed=2)[0]
    row = int(ids[3, 1])
    backend.weight[row].view(torch.uint8).bitwise_xor_(0x01)  # flip one bit in every byte of a used row
    with pytest.raises(StepMismatch, match="embedding bytes differ"):
        check_step(step, [ids], SEED)


def test_gate_catches_a_finalize_that_writes_nothing(monkeypatch):
    backend = make_backend("pinned_uva")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, prefetch=True)
    step._finalize = lambda out: out  # a stale finalize: leaves the poisoned static output
    with pytest.raises(StepMismatch):
        check_step(step, make_ids(1), SEED)


def test_gate_catches_a_wrong_consumer():
    backend = make_backend("device")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=2, prefetch=False)
    real = step.consume
    step.consume = lambda x, rows: real(x, rows).mul_(1.01)
    with pytest.raises(StepMismatch, match="output differs"):
        check_step(step, make_ids(1), SEED)


def test_gate_without_seed_uses_the_plain_lookup():
    backend = make_backend("pinned_uva")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, prefetch=True)
    check_step(step, make_ids(2, seed=4), None)
    step._finalize = lambda out: out
    with pytest.raises(StepMismatch):
        check_step(step, make_ids(1, seed=4), None)


def test_calibration_picks_count_from_measured_matmul():
    backend = make_backend("device")
    zero = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_us=0.0)
    assert zero.compute_matmuls == 0
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_us=500.0)
    assert step.matmul_us is not None and step.matmul_us > 0
    assert step.compute_matmuls == max(1, round(500.0 / step.matmul_us))
    with pytest.raises(ValueError, match="exactly one"):
        DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS)


def test_graph_modes_and_unsupported_axes_are_not_implemented_on_cpu():
    backend = make_backend("pinned_uva")
    for mode in ("breakable", "full"):
        with pytest.raises(NotImplementedError, match="needs CUDA"):
            DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, graph=mode)
    ids = make_ids(1)[0]
    pol = _tiny_policy()
    with pytest.raises(NotImplementedError, match="grid_frac"):
        run_step_case(_case("pinned_uva", grid_frac=0.5), backend, ids, None, pol, "cpu")
    with pytest.raises(NotImplementedError, match="stream_priority"):
        run_step_case(_case("pinned_uva", prefetch=True, stream_priority=-1), backend, ids, None, pol, "cpu")
    with pytest.raises(NotImplementedError, match="needs CUDA"):
        run_step_case(_case("pinned_uva", graph="breakable"), backend, ids, None, pol, "cpu")
    with pytest.raises(NotImplementedError, match="h2d_background needs CUDA"):
        run_step_case(_case("pinned_uva", h2d_background=True), backend, ids, None, pol, "cpu")


def test_full_graph_refused_when_etp_spans_dp():
    backend = make_backend("pinned_uva")
    backend.topology = Topology(tp=1, etp=2, dp=2)  # as on a rank whose table spans 2 DP ranks
    with pytest.raises(NotImplementedError, match="DP token counts"):
        DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, graph="full")


def _tiny_policy():
    from ple_bench.measure import TimingPolicy

    return TimingPolicy(warmup_ms=0.0, min_samples=3, max_samples=4, min_time_s=0.0, max_time_s=30.0,
                        max_noise=0.0, cold_l2=False, hot=False, graph=False)


def _case(impl: str, **kw) -> Case:
    base = dict(kind="step", impl=impl, vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS,
                num_tokens=TOKENS, hidden=HIDDEN, compute_us=200.0)
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("impl,prefetch", [("device", False), ("pinned_uva", False), ("pinned_uva", True)])
def test_run_step_case_record(impl, prefetch):
    backend = make_backend(impl)
    ids = torch.stack(make_ids(3, seed=21))  # three id sets, rotated into the static input
    rec = run_step_case(_case(impl, prefetch=prefetch), backend, ids, None, _tiny_policy(), "cpu",
                        table_seed=SEED)
    for key in ("step_ms", "lookup_ms", "compute_ms", "exposed_ms", "compute_in_step_ms",
                "compute_region_alone_ms", "compute_region_graph", "unstable", "graph_break_cost_ms", "median_ms",
                "samples_ms", "step_samples_ms", "lookup_samples_ms", "compute_samples_ms",
                "compute_in_step_samples_ms", "compute_region_alone_samples_ms", "compute_matmuls",
                "timer"):
        assert key in rec, key
    assert rec["timer"] == "host_monotonic"
    for key in ("step", "lookup", "compute"):
        samples = rec[f"{key}_samples_ms"]
        assert 3 <= len(samples) <= 4 and all(s > 0 and math.isfinite(s) for s in samples)
        assert rec[f"{key}_ms"] == pytest.approx(sorted(samples)[len(samples) // 2] if len(samples) % 2
                                                 else sum(sorted(samples)[1:3]) / 2)
    assert rec["median_ms"] == rec["step_ms"] and rec["samples_ms"] == rec["step_samples_ms"]
    assert rec["exposed_ms"] == pytest.approx(rec["step_ms"] - rec["compute_ms"])
    # the derived figures are not the measurement's: record.derive computes them (tests/test_record.py)
    assert "overlap_efficiency" not in rec and "compute_slowdown" not in rec
    assert "offload_overhead" not in rec  # derived from the run's resident steps (record.Peers)
    assert rec["compute_region_graph"] == "eager"  # functional mode: the eager case's own mode
    assert rec["compute_matmuls"] >= 1
    assert len(rec["compute_in_step_samples_ms"]) >= 5
    assert rec["compute_in_step_ms"] > 0 and rec["compute_region_alone_ms"] > 0
    assert rec["graph_break_cost_ms"] is None  # eager case


def test_run_step_case_flags_a_wrong_table():
    backend = make_backend("device")
    ids = make_ids(1, seed=8)[0]
    rec_ids = ids.clone()
    backend.weight[int(rec_ids[0, 0])].fill_(0.0)
    with pytest.raises(StepMismatch):
        run_step_case(_case("device"), backend, ids, None, _tiny_policy(), "cpu", table_seed=SEED)


@pytest.mark.parametrize("impl,prefetch", [("pinned_uva", True), ("device", True), ("pinned_uva", False)])
def test_breakable_step_binds_its_backend_calls(impl, prefetch):
    """The step's graph plumbing on a CPU with fake segments: the backend calls
    are the eager breaks, bound to this backend, the static ids, the in-place DP
    count list and the static rows; replaying them with fresh ids refreshes the
    static embeddings.  (Fake segments do not re-run the compute, so only the
    embeddings -- produced by the eager calls -- are checked here.)"""
    from ple_bench.run.graphs import BreakableGraph
    from tests.test_graphs import FakeDevice

    dev = FakeDevice()
    backend = make_backend(impl)
    other = make_backend(impl)  # a second table: must never be read
    other.fill_synthetic(SEED + 1, scale=0.5)
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=2, prefetch=prefetch,
                      graph="breakable",
                      graph_factory=lambda mode: BreakableGraph(mode, segment_factory=dev.factory,
                                                                pool_factory=object))
    sets = make_ids(4, seed=13)
    step.set_inputs(sets[0])
    step.run()  # captures (2 warm-up calls + capture), then replays
    graph = step.graphs[("step", "breakable")]
    calls = graph.eager_calls
    if prefetch:
        assert [c.fn.__func__.__name__ for c in calls] == ["start_prefetch", "finalize"]
        assert all(c.fn.__self__ is backend for c in calls)
        assert calls[0].args[0] is step.ids and calls[1].kwargs["out"] is step.rows
    else:
        assert len(calls) == 1 and calls[0].fn.__self__ is step and calls[0].args[0] is step.rows
    assert [k for k, _ in graph.steps][::2] == ["segment"] * (len(calls) + 1)
    for ids in sets[1:]:
        step.set_inputs(ids)
        step.rows.view(torch.uint8).fill_(0x7F)
        step.runner("step")()
        ref = synthetic_rows(ids.reshape(-1), DIM, SEED, torch.float8_e4m3fn).reshape(TOKENS, -1)
        assert torch.equal(step.rows.view(torch.uint8), ref.view(torch.uint8))


def test_breakable_compute_region_is_timed_between_the_graph_segments():
    """compute_slowdown of a breakable step: the region's events are eager breaks around the
    compute's segment of an instrumented graph; the timed step's graph carries no such break."""
    from ple_bench.run.graphs import BreakableGraph
    from tests.test_graphs import FakeDevice

    dev = FakeDevice()
    backend = make_backend("pinned_uva")
    step = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=2, prefetch=True,
                      graph="breakable",
                      graph_factory=lambda mode: BreakableGraph(mode, segment_factory=dev.factory,
                                                                pool_factory=object))
    step.set_inputs(make_ids(1, seed=5)[0])
    assert step.region_mode("breakable") == "breakable" and step.region_mode("full") == "eager"
    step.run()
    samples = step.compute_region_samples("step", 6, mode="breakable")
    assert len(samples) == 6 and all(s >= 0 and math.isfinite(s) for s in samples)
    names = [c.fn.__func__.__name__ for c in step.graphs[("step_region", "breakable")].eager_calls]
    assert names == ["start_prefetch", "_region_start", "_region_stop", "finalize"]
    timed = [c.fn.__func__.__name__ for c in step.graphs[("step", "breakable")].eager_calls]
    assert timed == ["start_prefetch", "finalize"]


def test_a_fresh_worker_of_the_same_run_reuses_the_runs_calibration(tmp_path, monkeypatch):
    """Each worker process used to calibrate on its own: after a failure the fresh worker could pick
    another matmul count, and a pinned step was then held against a resident step of other compute.
    The first calibration of a run is written to the run folder and every later worker reads it."""
    from ple_bench.run import step as step_mod
    from ple_bench.env import CALIBRATION_ENV

    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "calibration.json"))
    monkeypatch.setattr(step_mod, "_CALIBRATION", {})
    backend = make_backend("device")
    first = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_us=400.0)
    stored = step_mod.read_run_calibration()
    assert list(stored.values()) == [[first.compute_matmuls, first.matmul_us]]
    # a fresh worker (an empty per-process cache) whose own measurement would differ
    monkeypatch.setattr(step_mod, "_CALIBRATION", {})
    monkeypatch.setattr(DecodeStep, "_time_compute_ms", lambda self, n, repeats=5: 1e3 * n)  # 1 s per matmul
    again = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_us=400.0)
    assert (again.compute_matmuls, again.matmul_us) == (first.compute_matmuls, first.matmul_us)
    # outside a run (no file named) the process measures: the slow stand-in gives one matmul
    monkeypatch.delenv(CALIBRATION_ENV)
    monkeypatch.setattr(step_mod, "_CALIBRATION", {})
    alone = DecodeStep(backend, hidden=HIDDEN, num_tokens=TOKENS, compute_us=400.0)
    assert alone.compute_matmuls == 1
