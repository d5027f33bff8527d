"""Typed access generated from the schema: every record field declares its type (or its unit gives
it), ``results.load_records`` coerces each field to it once, at load (the file on disk is not
changed), and ``record.Record`` is the read-only view whose attributes are generated from the
schema -- a field is a typed property, any other name an AttributeError that names it.  The
declared types are checked against what the engine writes (a CPU lookup and a CPU decode step, as
stored and read back), so the schema and the records cannot drift apart unseen."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from ple_bench import record
from ple_bench.record import FIELDS, Field, Record, coerce, coerce_record
from ple_bench.report.data import Run, load_run
from ple_bench.results import RunWriter, load, load_records
from ple_bench.spec.case import Case

from ._fake_runs import gpu_meta


def _stored_run(tmp_path, rec: dict) -> tuple:
    writer = RunWriter(tmp_path / "run")
    writer.write_meta(gpu_meta("run"))
    writer.append(rec)
    return writer.run_dir, writer.records_path.read_bytes()


# ------------------------------------------------------------------ coerced once, at load

def test_numbers_stored_as_strings_or_ints_are_coerced_at_load_and_the_file_is_unchanged(tmp_path):
    case = Case(num_tokens=64, dim=32)
    stored = {**case.axes(), "case_id": case.case_id, "status": "ok", "reason": "",
              "schema_version": str(record.SCHEMA_VERSION),  # a string: still the current schema, not upgraded
              "median_ms": "0.25", "step_ms": 2, "num_tokens": "64", "n_samples": 30.0, "bytes_moved": "4096",
              "samples_ms": ["0.5", 1, "NaN"], "gbps": "fast", "table_in_host_memory": "true",
              "ceiling_exceeded": 0, "reason_code": "7"}
    run_dir, on_disk = _stored_run(tmp_path, stored)

    (rec,) = load_records(run_dir)
    assert rec["median_ms"] == 0.25 and type(rec["median_ms"]) is float
    assert rec["step_ms"] == 2.0 and type(rec["step_ms"]) is float
    assert rec["num_tokens"] == 64 and type(rec["num_tokens"]) is int
    assert rec["n_samples"] == 30 and type(rec["n_samples"]) is int
    assert rec["bytes_moved"] == 4096 and type(rec["bytes_moved"]) is int
    assert rec["samples_ms"] == [0.5, 1.0, None]
    assert rec["gbps"] is None  # not a number: None, as every reader's num() read it
    assert rec["table_in_host_memory"] is True and rec["ceiling_exceeded"] is False
    assert rec["schema_version"] == record.SCHEMA_VERSION and "upgraded_from" not in {k for k, v in rec.items() if v}
    assert rec["reason_code"] == "7"  # a key the schema does not name is kept as stored
    assert rec["dim"] == 32 and rec["kind"] == "lookup"

    # the stored file is what was written: coercion is the reader's, once
    assert (run_dir / "records.jsonl").read_bytes() == on_disk
    assert json.loads(on_disk)["median_ms"] == "0.25"

    # the DataFrame view and the report's view read the same coerced values
    df = load(run_dir)
    assert df.loc[0, "median_ms"] == 0.25 and df["median_ms"].dtype == float
    view = load_run(run_dir).records[0]
    assert isinstance(view, Record) and view.median_ms == 0.25 and view.num_tokens == 64
    assert view["path"] == "device · torch_masked"  # the report's own label, by item


def test_coerce_reads_each_declared_type():
    assert coerce("1e3", "float") == 1000.0 and coerce(float("inf"), "float") is None
    assert coerce(True, "float") is None  # a flag is not a number
    assert coerce("12", "int") == 12 and type(coerce(12.0, "int")) is int
    assert coerce(2.5, "int") == 2.5  # a count stored with a fraction keeps it: never rounded away
    assert coerce("false", "bool") is False and coerce(1, "bool") is True and coerce("maybe", "bool") is None
    assert coerce(["1", None, 2], "list[float]") == [1.0, None, 2.0] and coerce("1,2", "list[float]") is None
    assert coerce([0, 1], "list[bool]") == [False, True]
    assert coerce({"a": 1}, "dict") == {"a": 1} and coerce("text", "str") == "text"
    assert coerce(None, "int") is None


def test_coercing_a_coerced_record_changes_nothing():
    rec = coerce_record({"median_ms": "0.5", "rows": "16", "samples_ms": ["1"], "prefetch": 0, "path": "x"})
    assert rec == {"median_ms": 0.5, "rows": 16, "samples_ms": [1.0], "prefetch": False, "path": "x"}
    assert coerce_record(rec) == rec


# ------------------------------------------------------------------ the typed, read-only view

def test_a_record_view_reads_fields_as_typed_attributes():
    r = Record({"median_ms": "0.5", "num_tokens": 8.0, "impl": "pinned_uva", "path": "pinned_uva · x"})
    assert r.median_ms == 0.5 and type(r.median_ms) is float
    assert r.num_tokens == 8 and type(r.num_tokens) is int
    assert r.impl == "pinned_uva" and r.get("median_ms") == r["median_ms"] == 0.5
    assert r.step_ms is None  # a field the record lacks reads None, as .get did


def test_an_unknown_attribute_is_an_error_naming_it():
    r = Record({"median_ms": 0.5})
    with pytest.raises(AttributeError, match="'median'.*not in the schema"):
        r.median  # noqa: B018 -- a typo of median_ms
    with pytest.raises(AttributeError, match="'path'"):
        r.path  # noqa: B018 -- the report's label is no schema field: by item only
    assert not hasattr(r, "stepms")


def test_a_record_view_is_read_only_and_copies_as_a_dict():
    r = Record({"median_ms": 0.5, "status": "ok"})
    for mutate in (lambda: r.__setitem__("median_ms", 1.0), lambda: r.update(status="failed"),
                   lambda: r.pop("status"), lambda: r.setdefault("x", 1), lambda: r.clear(),
                   lambda: setattr(r, "median_ms", 1.0)):
        with pytest.raises((TypeError, AttributeError)):
            mutate()
    assert r == {"median_ms": 0.5, "status": "ok"}
    copy = dict(r)
    copy["median_ms"] = 1.0
    assert r.median_ms == 0.5
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is Record and back == r
    assert json.loads(json.dumps(r)) == {"median_ms": 0.5, "status": "ok"}


def test_a_run_built_in_memory_reads_through_the_same_view():
    run = Run(path=None, meta={}, records=[{"case_id": "c", "median_ms": "0.75"}])
    assert run.records[0].median_ms == 0.75


# ------------------------------------------------------------------ the schema and the view cannot drift

def test_the_view_has_one_typed_attribute_per_schema_field_and_case_axis():
    props = {name for name, v in vars(Record).items() if isinstance(v, property)}
    assert props == {f.name for f in FIELDS} | {f.name for f in dataclasses.fields(Case)}
    for f in FIELDS:
        assert getattr(Record, f.name).fget.__annotations__["return"] == f"{f.type} | None", f.name
        assert f.definition in getattr(Record, f.name).__doc__
    assert getattr(Record, "num_tokens").fget.__annotations__["return"] == "int | None"
    assert getattr(Record, "extra").fget.__annotations__["return"] == "dict | None"


def test_a_field_without_a_unit_must_declare_its_type():
    with pytest.raises(ValueError, match="'ratio'.*declare its type"):
        Field("ratio", "", "all", "a ratio")
    with pytest.raises(ValueError, match="'ratio'"):
        Field("ratio", "", "all", "a ratio", type="number")
    assert Field("x_ms", "ms", "all", "").type == "float"
    assert Field("x_samples_ms", "ms", "all", "").type == "list[float]"
    assert Field("x_bytes", "B", "all", "").type == "int"
    assert Field("flag", "bool", "all", "").type == "bool"


@pytest.fixture
def cpu_records():
    """A lookup and a decode step measured on this CPU, built and stored as the run loop does, and
    read back as JSON (what load_records reads)."""
    torch = pytest.importorskip("torch")
    from ple_bench.measure import TimingPolicy
    from ple_bench.run.executor import CaseExecutor

    policy = TimingPolicy(warmup_ms=0.0, min_samples=3, max_samples=4, min_time_s=0.0, max_time_s=5.0,
                          max_noise=0.0, cold_l2=False, hot=False, graph=False, id_sets=2)
    executor = CaseExecutor(device=torch.device("cpu"))
    cases = [Case(impl="pinned_cpu_gather", vocab_size=4096, dim=16, num_heads=2, num_tokens=8, ids_on="host"),
             Case(kind="step", impl="device", vocab_size=4096, dim=16, num_heads=2, num_tokens=8, hidden=64,
                  compute_us=20.0)]
    context = record.RunContext({"mode": "functional"})
    try:
        out = []
        for case in cases:
            result = executor.outcome(case, policy)
            assert result.status == "ok", result.reason
            rec = record.build(case, result, context)
            context.peers.add(rec)
            out.append(json.loads(json.dumps({**{k: None for k in record.RECORD_KEYS}, **rec}, default=str)))
        return out
    finally:
        executor.release_table()


def test_the_declared_types_are_the_types_the_engine_writes(cpu_records):
    lookup, step = cpu_records
    assert lookup["median_ms"] is not None and step["step_ms"] is not None  # measured: not a test on Nones
    for rec in cpu_records:
        coerced = coerce_record(rec)
        for key, value in rec.items():
            assert coerced[key] == value and type(coerced[key]) is type(value), (key, value, coerced[key])
