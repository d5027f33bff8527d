"""The run's meta.json as one typed object (ple_bench.run_meta.RunMeta): every stored meta.json
loads and reads back as written, its figures are typed at load, and provenance's writers keep the
file's format."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ple_bench.results import RunWriter, load_meta
from ple_bench.run_meta import CaseCeiling, Ceilings, Device, RunMeta, as_meta

ROOT = Path(__file__).resolve().parents[1]
STORED = sorted((ROOT / "tests" / "fixtures").rglob("meta.json"))  # never docs/runs: the archive changes


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.parent.name)
def test_every_stored_meta_loads_and_reads_back_as_written(path):
    meta = RunMeta.load(path.parent)
    stored = json.loads(path.read_text(encoding="utf-8"))
    assert meta.to_json() == stored and dict(meta) == stored
    assert meta.run_id == stored["run_id"] and meta.suite == stored["suite"] and meta.mode == stored["mode"]
    assert meta.num_cases == stored["num_cases"]
    c = meta.ceilings
    assert c.h2d_gbps == stored["ceilings"]["h2d_gbps"] and c.d2d_gbps == stored["ceilings"]["d2d_gbps"]
    assert c.hbm_read_gbps == stored["ceilings"].get("hbm_read_gbps")
    assert len(c.host_gather) == len(stored["ceilings"].get("host_gather") or {})
    assert len(c.random_row) == len(stored["ceilings"].get("random_row") or {})
    assert meta.device is not None and meta.device.name == stored["device"]["name"]
    assert meta.device.memory_bytes == stored["device"]["memory_bytes"]


def test_figures_are_typed_at_load():
    meta = RunMeta({"num_cases": "12", "ceilings": {"h2d_gbps": "25.5", "d2d_gbps": float("nan"), "flag": True,
                                                     "allreduce_busbw_gbps_w2": 80, "allreduce_busbw_x": "n/a",
                                                     "host_gather": {"k": {"rows": "64", "ms": 0.5, "table_bytes": 1024,
                                                                           "row_bytes": 160, "threads": 4},
                                                                     "bad": "not an entry"}},
                    "device": {"name": "GPU", "memory_bytes": "80e9", "sm_count": None}})
    assert meta.num_cases == 12
    c = meta.ceilings
    assert c.h2d_gbps == 25.5 and c.d2d_gbps is None and c.figure("flag") is None
    assert c.positive("h2d_gbps") == 25.5 and c.gbps == {"h2d_gbps": 25.5, "allreduce_busbw_gbps_w2": 80.0}
    assert sorted(c.starting("allreduce_busbw"), key=str) == [80.0, None]
    (hg,) = c.host_gather
    assert (hg.key, hg.rows, hg.ms, hg.table_bytes, hg.row_bytes, hg.threads, hg.ids) == ("k", 64.0, 0.5, 1024.0, 160.0, 4.0, None)
    assert hg.timed
    assert meta.device == Device.of(meta["device"]) and meta.device.memory_bytes == 80e9 and meta.device.sm_count is None
    assert Device.of({}) is None and Device.of(None) is None and Device.of("A100").name == "A100"
    assert Ceilings(None).raw == {} and Ceilings("junk").host_gather == ()
    assert CaseCeiling.of(1, {"memory": "pinned", "order": ""}).order is None


def test_an_empty_or_missing_meta_reads_as_unknown():
    meta = as_meta(None)
    assert (meta.run_id, meta.status, meta.num_cases, meta.device) == (None, None, None, None)
    assert meta.ceilings.gbps == {} and meta.compute_profile == {} and meta.repeated == {}
    assert as_meta(meta) is meta


def test_a_run_meta_is_read_only_but_through_its_changes():
    meta = RunMeta({"ceilings": {"h2d_gbps": 20}})
    with pytest.raises(TypeError):
        meta["x"] = 1  # type: ignore[index]
    assert meta.ceilings.h2d_gbps == 20
    meta.merge_ceilings({"h2d_gbps": 25, "d2d_gbps": 900})
    assert meta.ceilings.h2d_gbps == 25 and meta.ceilings.d2d_gbps == 900  # the typed view follows the change
    assert meta.keep_device({"name": "GPU"}) and not meta.keep_device({"name": "other"})
    assert meta.device.name == "GPU"
    assert meta.add_case_ceiling("random_row", "k", {"rows": 8, "ms": 1.0})
    assert not meta.add_case_ceiling("random_row", "k", {"rows": 9, "ms": 1.0})
    assert [c.rows for c in meta.ceilings.random_row] == [8.0]


def test_provenance_writes_the_same_file(tmp_path):
    provenance = pytest.importorskip("ple_bench.run.provenance")
    writer = RunWriter(tmp_path / "run")
    start = {"run_id": "run", "status": "running", "num_cases": 2}
    writer.write_meta(start)
    meta = RunMeta(start)
    provenance.add_measured(writer, meta, ceilings={"h2d_gbps": 25.0}, device={"name": "GPU"})
    provenance.add_measured(writer, meta, ceilings={"d2d_gbps": 900.0}, device={"name": "other"}, ranks=[{"rank": 0}])
    provenance.note(writer, meta, repeated={"a": [3, 2]})
    hg = {"table_bytes": 1024, "rows": 64, "row_bytes": 160, "ms": 0.5}
    result = SimpleNamespace(host_gather_ceiling=hg, random_row_ceilings=[{"key": "rr1", "rows": 8, "ms": 1.0}])
    provenance.keep_case_ceilings(result, meta, writer)
    provenance.keep_case_ceilings(result, meta, writer)  # once per key
    assert load_meta(writer.run_dir) == meta.to_json() == {
        "run_id": "run", "status": "running", "num_cases": 2,
        "ceilings": {"h2d_gbps": 25.0, "d2d_gbps": 900.0, "host_gather": {"1024:64:160": hg},
                     "random_row": {"rr1": {"key": "rr1", "rows": 8, "ms": 1.0}}},
        "device": {"name": "GPU"}, "ranks": [{"rank": 0}], "repeated": {"a": [3, 2]}}
    assert meta.repeated == {"a": [3, 2]} and [c.key for c in meta.ceilings.host_gather] == ["1024:64:160"]
