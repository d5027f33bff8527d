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
    assert all(c.kind == "step" and c.compute_us == 200 for c in cases) and len(cases) <= 120
    ids_of = {c.case_id for c in cases}
    pinned = [c for c in cases if c.impl != "device"]
    for c in pinned:  # each pinned step's resident baselines run in the same suite
        assert {b.case_id for b in resident_baselines(c)} <= ids_of, c.case_id
    small = [c for c in pinned if c.table_bytes < 40 * GIB]
    paths = {(c.impl, c.kernel, c.ids_on) for c in small}
    assert paths == {("pinned_uva", "triton_tuned", "device"), ("pinned_uva", "dedup_triton", "device"),
                     ("pinned_hot_cache", "", "device"), ("pinned_cpu_gather", "", "host"),
                     ("pinned_host_flag", "", "host")}
    for path in paths:  # every path at every workload and token count
        at = {(c.ids, c.num_tokens) for c in small if (c.impl, c.kernel, c.ids_on) == path}
        assert at == {(i, t) for i in IDS for t in (64, 256, 512)}, path
    big = [c for c in pinned if c.table_bytes > 40 * GIB]
    assert {(c.impl, c.ids) for c in big} == {(impl, ids) for impl in ("pinned_cpu_gather", "pinned_host_flag")
                                              for ids in ("text:code", "uniform")}
    assert all(c.graph == "full" for c in pinned if c.impl == "pinned_host_flag")
    assert all(c.vocab_size == 320001536 and c.host_alloc == "exact" for c in big)


def test_every_verdict_group_of_the_default_and_traffic_suites_measures_the_posted_host_gather():
    """One table, ids and token count must not get two answers from two suites because one of them
    never measured the deciding path (issue 43: traffic_steps held the 47.7 GiB table against HBM
    with the CPU gather alone, the default suite's 8 GiB verdicts came from the UVA kernel alone)."""
    for name in ("default", "traffic_steps"):
        groups: dict[tuple, set[str]] = {}
        for c in load_suite(name).cases:
            if c.kind == "step" and c.impl != "device" and c.compute_us > 0:
                groups.setdefault((c.table_bytes, c.compute_us, c.ids, c.num_tokens), set()).add(c.impl)
        assert groups, name
        lacking = sorted(k for k, impls in groups.items() if "pinned_host_flag" not in impls)
        assert not lacking, (name, lacking)
