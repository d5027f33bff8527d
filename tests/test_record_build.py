"""One record builder: a case's worker reports a ``record.CaseResult`` (its outcome, what it
measured, what its backend declares) and ``record.build`` is the one place a record is assembled
from it, derived figures included.  Tested on synthetic results, on the results a CPU executor
makes (after a pickle round trip, as the worker pool's pipes carry them), and on the package's
source: no module of run/ but the suite loop assembles a record, and the loop never imports a
backend to describe one."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

from ple_bench import record
from ple_bench.measure import TimingPolicy
from ple_bench.record import CaseResult, Peers, RunContext, build
from ple_bench.run.executor import CaseExecutor
from ple_bench.spec.case import Case

RUN_DIR = Path(__file__).resolve().parents[1] / "ple_bench" / "run"
CEILINGS = {"device_random_row_gbps_160B": 250.0, "pinned_random_row_gbps_160B": 20.0}


def _policy() -> TimingPolicy:
    return TimingPolicy(warmup_ms=0.0, min_samples=1, max_samples=2, min_time_s=0.0, max_time_s=0.05, id_sets=2)


def _lookup_result(**kw) -> CaseResult:
    measured = {"rows": 16384, "row_bytes": 160, "bytes_moved": 16384 * 160, "median_ms": 0.5, "timer": "cuda_event"}
    return CaseResult(measurement=measured, **kw)


# ------------------------------------------------------------ build on synthetic results

def test_build_assembles_identity_axes_measurement_and_declared_facts_then_derives():
    case = Case(impl="pinned_uva", kernel="triton_tuned", dim=160, dtype="fp8", num_heads=16, num_tokens=1024,
                vocab_size=1 << 20)
    result = _lookup_result(lookup_mechanism="kernel", table_in_host_memory=True, kernel_ran="triton_tuned",
                            table_cost={"pinned_bytes": 3 << 20, "table_reused": False},
                            traffic={"unique_rows_fraction": 0.875}, duration_s=1.5,
                            finished_at="2026-12-02T17:00:00+00:00",
                            host_gather_ceiling={"ms": 1.0}, random_row_ceilings=[{"key": "k", "gbps": 1.0}])
    rec = build(case, result, RunContext({"mode": "gpu", "ceilings": CEILINGS}))
    assert (rec["case_id"], rec["status"], rec["reason"], rec["mode"]) == (case.case_id, "ok", "", "gpu")
    assert {k: rec[k] for k in case.axes()} == case.axes() and rec["world_size"] == 1
    assert (rec["lookup_mechanism"], rec["table_in_host_memory"], rec["kernel_ran"]) == ("kernel", True, "triton_tuned")
    assert rec["pinned_bytes"] == 3 << 20 and rec["table_reused"] is False and rec["unique_rows_fraction"] == 0.875
    assert rec["duration_s"] == 1.5 and rec["finished_at"] == "2026-12-02T17:00:00+00:00"
    # derived by record.derive: 16384 rows x 160 B in 0.5 ms = 5.24288 GB/s, held against the pinned
    # ceiling because the result declares the table in host memory (impl alone would say the same here)
    assert rec["gbps"] == pytest.approx(5.24288) and rec["ceiling"] == "pinned_random_row_gbps_160B"
    assert rec["schema_version"] == record.SCHEMA_VERSION
    # the per-case ceiling entries are meta.json's, never record fields
    assert "host_gather_ceiling" not in rec and "random_row_ceiling_entry" not in rec
    assert set(rec) <= set(record.RECORD_KEYS) | set(case.axes())


def test_the_declared_table_placement_comes_from_the_result_not_the_impl_name():
    case = Case(impl="mypkg.mod:Emb", dim=160, dtype="fp8", num_heads=16, num_tokens=1024, vocab_size=1 << 20)
    context = RunContext({"mode": "gpu", "ceilings": CEILINGS})
    resident = build(case, _lookup_result(lookup_mechanism="kernel", table_in_host_memory=False), context)
    host = build(case, _lookup_result(lookup_mechanism="kernel", table_in_host_memory=True), context)
    assert resident["ceiling"] == "device_random_row_gbps_160B" and host["ceiling"] == "pinned_random_row_gbps_160B"


def test_build_reads_the_run_s_peers_for_a_prefetch_step_s_twin():
    axes = dict(kind="step", impl="pinned_uva", dim=160, dtype="fp8", num_heads=16, num_tokens=256,
                vocab_size=1 << 20, compute_us=100.0)
    off, on = Case(**axes, prefetch=False), Case(**axes, prefetch=True)
    context = RunContext({"mode": "gpu"}, Peers())

    def step(exposed_ms: float) -> CaseResult:
        return CaseResult(measurement={"median_ms": 1.0, "step_ms": 1.0, "exposed_ms": exposed_ms,
                                       "timer": "cuda_event"},
                          lookup_mechanism="kernel", table_in_host_memory=True)

    first = build(off, step(0.4), context)
    context.peers.add(first)
    second = build(on, step(0.1), context)
    assert second["overlap_twin"] == off.case_id and second["overlap_efficiency"] == pytest.approx(0.75)
    alone = build(on, step(0.1), RunContext({"mode": "gpu"}))  # no peers: no twin
    assert alone["overlap_twin"] is None and alone["overlap_efficiency"] is None


def test_a_case_that_ended_without_a_measurement_keeps_its_reason_traceback_and_fields():
    case = Case(impl="device", num_tokens=8)
    failed = build(case, CaseResult(status="failed", reason="RuntimeError: boom", traceback="Traceback ..."),
                   RunContext({"mode": "functional"}))
    assert (failed["status"], failed["reason"], failed["traceback"]) == ("failed", "RuntimeError: boom",
                                                                         "Traceback ...")
    assert failed.get("median_ms") is None and failed["gbps"] is None
    skipped = build(case, CaseResult(status="skipped", reason="no GPU", measurement={"serve_batch": 12}),
                    RunContext({"mode": "functional"}))
    assert skipped["serve_batch"] == 12 and skipped["traceback"] is None


# ------------------------------------------------------------ results a CPU executor makes

@pytest.fixture
def executor():
    ex = CaseExecutor(device=torch.device("cpu"))
    yield ex
    ex.release_table()


def test_a_measured_case_s_result_crosses_a_pipe_and_builds_its_record(executor):
    case = Case(impl="pinned_cpu_gather", vocab_size=4096, dim=16, num_heads=2, num_tokens=8, ids_on="host")
    result = pickle.loads(pickle.dumps(executor.outcome(case, _policy())))
    assert result.status == "ok", result.reason
    # the facts are the backend's declaration, read in the worker
    assert (result.lookup_mechanism, result.table_in_host_memory, result.kernel_ran) == ("host_gather", True, None)
    assert result.host_gather_ceiling is not None and "host_gather_ceiling" not in result.measurement
    rec = build(case, result, RunContext({"mode": "functional"}))
    assert rec["rows"] == 16 and rec["row_bytes"] == case.row_bytes == 32 and rec["median_ms"] > 0
    assert rec["lookup_mechanism"] == "host_gather" and rec["ceiling"] == "host_gather"
    assert rec["unique_rows_fraction"] is not None and rec["pinned_bytes"] is not None

    kernel_case = Case(impl="pinned_uva", kernel="torch_uva", vocab_size=4096, dim=16, num_heads=2, num_tokens=8)
    kernel = executor.outcome(kernel_case, _policy())
    assert kernel.status == "ok" and (kernel.lookup_mechanism, kernel.kernel_ran) == ("kernel", "torch_uva")


def test_an_outcome_that_is_not_a_measurement_still_carries_the_backend_s_facts(executor):
    skipped = executor.outcome(Case(impl="pinned_uva", vocab_size=4096, dim=16, num_tokens=8, graph="full"),
                               _policy())
    assert skipped.status == "skipped" and "CUDA" in skipped.reason
    assert (skipped.lookup_mechanism, skipped.table_in_host_memory) == ("kernel", True)
    failed = executor.outcome(Case(impl="tests.plugin_backends:RaisingBackend", vocab_size=4096, dim=16,
                                   num_tokens=8), _policy())
    assert failed.status == "failed" and "planted failure in lookup" in failed.reason
    assert "Traceback" in failed.traceback and failed.table_in_host_memory is False
    unknown = executor.outcome(Case(impl="no_such_module:Emb", vocab_size=4096, dim=16, num_tokens=8), _policy())
    assert unknown.status == "skipped" and (unknown.lookup_mechanism, unknown.table_in_host_memory) == (None, None)


# ------------------------------------------------------------ the source: one assembler

#: record fields that are a CaseResult's attributes: no module of run/ writes them as dict keys
RESULT_ATTRIBUTES = ("lookup_mechanism", "table_in_host_memory", "kernel_ran", "duration_s", "finished_at")


def assembly_violations(sources: dict[str, str]) -> list[str]:
    """Where a module (name -> source) assembles a record outside ``record.build``: a call of
    ``build`` or ``derive`` from anywhere but the suite loop (``loop``: build only), a record field
    that is a ``CaseResult`` attribute written as a dict key, or an import of the backends in the
    loop."""
    found = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                func = node.func  # record.build(...), or build(...) imported from it
                on_record = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "record"
                called = func.attr if on_record else getattr(func, "id", "")
                if called == "derive" or (called == "build" and name != "loop"):
                    found.append(f"{name}:{node.lineno} calls {called}")
            keys = []
            if isinstance(node, ast.Dict):
                keys = node.keys
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                keys = [node.slice]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("setdefault", "update"):
                keys = node.args[:1] + [ast.Constant(k.arg) for k in node.keywords if k.arg]
            for key in keys:
                if isinstance(key, ast.Constant) and key.value in RESULT_ATTRIBUTES:
                    found.append(f"{name}:{node.lineno} writes {key.value!r}")
            if name == "loop" and isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any("backends" in m for m in modules):
                    found.append(f"{name}:{node.lineno} imports the backends")
    return found


def test_only_the_suite_loop_builds_records_and_it_imports_no_backend():
    sources = {p.stem: p.read_text() for p in sorted(RUN_DIR.glob("*.py"))}
    assert "loop" in sources and "record.build(" in sources["loop"]
    assert assembly_violations(sources) == []


@pytest.mark.parametrize("name,text,expect", [
    ("dispatch", "rec = record.build(case, result, run)\n", "calls build"),
    ("serve", "from ..record import build\nrec = build(case, result, run)\n", "calls build"),
    ("loop", "record.derive(rec, {}, peers)\n", "calls derive"),
    ("torchrun", "rec = {'case_id': 'x', 'duration_s': 1.0}\n", "writes 'duration_s'"),
    ("executor", "rec['kernel_ran'] = 'k'\n", "writes 'kernel_ran'"),
    ("loop", "rec.setdefault('lookup_mechanism', None)\n", "writes 'lookup_mechanism'"),
    ("loop", "from ..backends import get_backend\n", "imports the backends"),
])
def test_the_assembly_check_can_fail(name, text, expect):
    (found,) = assembly_violations({name: text})
    assert expect in found
