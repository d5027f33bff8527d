"""suites/traffic_steps.toml: every step path on real traces beside the synthetic laws, each pinned
step with the resident steps it is held against (record.Peers needs them in the same run), within
the time the GPU run has (about 1.3 s a step case: at most 100 cases)."""

from __future__ import annotations

from ple_bench.spec.case import resident_baselines
from ple_bench.spec.suite import load_suite

IDS = {"text:code", "text:prose", "zipf:1.1", "uniform"}
GIB = 1 << 30


def test_every_step_path_on_real_and_synthetic_ids_with_its_baselines():
    suite = load_suite("traffic_steps")
    cases = suite.cases
    assert all(c.kind == "step" and c.compute_us == 200 for c in cases) and len(cases) <= 100
    ids_of = {c.case_id for c in cases}
    pinned = [c for c in cases if c.impl != "device"]
    for c in pinned:  # each pinned step's resident baselines run in the same suite
        assert {b.case_id for b in resident_baselines(c)} <= ids_of, c.case_id
    small = [c for c in pinned if c.table_bytes < 40 * GIB]
    paths = {(c.impl, c.kernel, c.ids_on) for c in small}
    assert paths == {("pinned_uva", "triton_tuned", "device"), ("pinned_uva", "dedup_triton", "device"),
                     ("pinned_hot_cache", "", "device"), ("pinned_cpu_gather", "", "host")}
    for path in paths:  # every path at every workload and token count
        at = {(c.ids, c.num_tokens) for c in small if (c.impl, c.kernel, c.ids_on) == path}
        assert at == {(i, t) for i in IDS for t in (64, 256, 512)}, path
    big = [c for c in pinned if c.table_bytes > 40 * GIB]
    assert {(c.impl, c.ids) for c in big} == {("pinned_cpu_gather", "text:code"), ("pinned_cpu_gather", "uniform")}
    assert all(c.vocab_size == 320001536 and c.host_alloc == "exact" for c in big)
