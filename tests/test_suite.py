"""Suites: the shipped files, the format (ranges, variants, exclusions, constraints),
validation messages, de-duplication and case-id stability."""

import dataclasses
import shutil
import textwrap

import pytest

from ple_bench.spec.case import resident_baselines, Case
from ple_bench.spec.listing import case_json, format_cases
from ple_bench.spec.suite import REPO_SUITES_DIR, SuiteError, list_suites, load_suite
from ple_bench.units import DTYPE_BYTES, format_bytes

SHIPPED = ["default", "full", "nightly", "overlap", "smoke", "topology"]
GiB, MiB = 1 << 30, 1 << 20


def write(tmp_path, body, name="s.toml", header=True):
    text = textwrap.dedent(body)
    if header:
        text = '[suite]\ndescription = "test suite"\n' + text
    path = tmp_path / name
    path.write_text(text)
    return path


def cases_of(tmp_path, body):
    return load_suite(write(tmp_path, body)).cases


def table_bytes(case):
    return case.vocab_size * case.dim * DTYPE_BYTES[case.dtype]


# ------------------------------------------------------------------ shipped suites
@pytest.fixture(scope="module")
def shipped():
    return {s.name: s for s in list_suites()}


def test_every_shipped_suite_loads(shipped):
    assert set(SHIPPED) <= set(shipped)
    for name in SHIPPED:
        suite = shipped[name]
        assert suite.description and suite.cases
        ids = [c.case_id for c in suite.cases]
        assert len(ids) == len(set(ids))
        assert sum(len(g.case_ids) for g in suite.groups) == len(suite.cases)
        assert suite.path == REPO_SUITES_DIR / f"{name}.toml"
        assert suite.path.read_text().startswith("#")  # comment header documents the format


def test_smoke_is_small_and_covers_the_axes(shipped):
    smoke = shipped["smoke"]
    cases = smoke.cases
    assert 20 <= len(cases) <= 70  # with the resident baselines of its pinned steps
    assert not smoke.gpu_only
    # ids on the host for every path, as a lookup and in the step
    host = {(c.kind, c.impl) for c in cases if c.ids_on == "host"}
    assert {(k, i) for k in ("lookup", "step") for i in ("device", "pinned_uva", "pinned_cpu_gather",
                                                         "pinned_copy_engine")} <= host
    assert {c.impl for c in cases} == {"device", "pinned_uva", "pinned_cpu_gather", "pinned_hot_cache",
                                       "pinned_copy_engine"}
    # every lookup path runs in CI, as a lookup and inside the decode step
    from ple_bench.backends import kernel_names

    paths = {(c.kind, c.impl, c.kernel) for c in cases}
    for kernel in ("torch_uva", "triton_tuned", "dedup_triton"):
        assert kernel in kernel_names()
        assert {("lookup", "pinned_uva", kernel), ("step", "pinned_uva", kernel)} <= paths
    assert {c.dtype for c in cases} == {"fp32", "fp16", "bf16", "fp8"}
    assert {c.prefetch for c in cases} == {True, False}
    assert {c.ids.split(":")[0] for c in cases} == {"uniform", "zipf", "ngram"}
    steps = [c for c in cases if c.kind == "step"]
    assert 2 <= len(steps) and all(0 < c.compute_us <= 100 for c in steps)
    topologies = {(c.tp, c.etp, c.dp) for c in cases}
    assert {(1, 2, 2), (2, 2, 1)} <= topologies
    assert all(c.num_tokens * c.num_heads <= 64 for c in cases)
    assert all(table_bytes(c) <= 4 * MiB for c in cases)
    assert {c.host_alloc for c in cases} == {"torch", "exact", "exact_huge"}


def test_default_suite_shape(shipped):
    default = shipped["default"]
    cases = default.cases
    assert 60 <= len(cases) <= 180  # 156 cases ran in 331 s on an H200 (docs/benchmark-engine.md)
    host = [c for c in cases if c.ids_on == "host" and c.impl in ("pinned_cpu_gather", "pinned_copy_engine")]
    assert {(c.impl, c.num_tokens) for c in host if table_bytes(c) > 32 * GiB - 160} >= {
        (i, t) for i in ("pinned_cpu_gather", "pinned_copy_engine") for t in (256, 4096)}
    assert default.gpu_only and default.functional_fallback == "smoke"
    sizes = [table_bytes(c) for c in cases]
    assert 64 * MiB - 160 < min(sizes) <= 64 * MiB
    assert 100 * GiB - 160 < max(sizes) <= 100 * GiB  # the "large" group
    qwen = [c for c in cases if (c.dtype, c.dim, c.num_heads) == ("fp8", 160, 16)]
    assert {table_bytes(c) // MiB for c in qwen} >= {63, 1023, 8191, 32767}
    # the production table (47.7 GiB) both ways, as lookups at 256 and 4096 tokens and a decode step
    prod = [c for c in qwen if c.vocab_size == 320_001_536]
    uva = [c for c in prod if c.impl == "pinned_uva"]
    assert {(c.host_alloc, c.kind, c.num_tokens) for c in uva} == {
        (mode, kind, tokens) for mode in ("torch", "exact")
        for kind, tokens in (("lookup", 256), ("lookup", 4096), ("step", 256))}
    # and the best host paths, as faster_than_hbm measures them (tests/test_suite_verdicts.py)
    host = {(c.impl, c.graph, c.ids_on, c.num_tokens) for c in prod if c.impl not in ("device", "pinned_uva")}
    assert host == {(i, "full", "host", t) for i in ("pinned_host_graph", "pinned_host_flag") for t in (64, 256, 512)}
    assert any(c.impl == "device" and c.kind == "step" and c.ids_on == "device" for c in prod)  # its baseline
    # the deciding pair -- the primary path and its resident baselines -- is measured over fresh processes;
    # the other host paths once
    flag = [c for c in prod if c.impl == "pinned_host_flag" and not c.extra]
    assert flag and all(default.repeat_of(c.case_id) == (4, 2) for c in flag)
    assert all(default.repeat_of(b.case_id) == (4, 2) for c in flag for b in resident_baselines(c))
    assert not any(default.repeat_of(c.case_id) for c in prod if c.impl == "pinned_host_graph" or c.extra)
    large = [c for c in cases if table_bytes(c) > 64 * GiB]
    assert large and {c.host_alloc for c in large} == {"exact"}
    assert {c.host_alloc for c in cases if c not in prod and c not in large} == {"torch"}
    assert {(c.dtype, c.dim) for c in cases} >= {("bf16", 128), ("fp32", 128), ("fp8", 160)}
    assert min(c.num_tokens for c in cases) == 64 and max(c.num_tokens for c in cases) == 32768
    assert {c.prefetch for c in cases if c.impl == "pinned_uva"} == {True, False}
    assert {c.graph for c in cases if c.kind == "lookup"} == {"eager", "full"}
    steps = [c for c in cases if c.kind == "step"]
    assert {c.compute_us for c in steps} == {50.0, 200.0}
    assert {(c.impl, c.prefetch) for c in steps} >= {("device", False), ("pinned_uva", False), ("pinned_uva", True)}
    assert {c.ids for c in cases} == {"uniform", "zipf:1.1", "ngram"}
    assert {"warmup_ms", "min_samples", "max_time_s"} <= set(default.timing)


def test_gpu_suites(shipped):
    nightly = shipped["nightly"]
    assert 15 <= len(nightly) <= 30 and nightly.gpu_only
    overlap = shipped["overlap"]
    assert {c.kind for c in overlap.cases} == {"step"}
    assert {c.compute_us for c in overlap.cases} == {0.0, 25.0, 50.0, 100.0, 200.0, 400.0}
    assert {c.graph for c in overlap.cases} == {"eager", "breakable", "full"}
    assert {c.stream_priority for c in overlap.cases} == {0, -1}
    assert {c.grid_frac for c in overlap.cases} == {1.0, 0.5, 0.25}
    assert all(c.kernel == "triton_tuned" for c in overlap.cases if c.grid_frac != 1.0)
    assert {c.num_tokens for c in overlap.cases} == {64, 128, 256, 512}
    assert all(table_bytes(c) >= 32 * GiB - 160 for c in overlap.cases)
    assert all((c.dtype, c.dim, c.num_heads) == ("fp8", 160, 16) for c in overlap.cases)
    full = shipped["full"]
    assert len(full) > 10 * len(shipped["default"])
    assert {c.graph for c in full.cases} == {"eager", "breakable", "full"}


def test_topology_suite(shipped):
    topo = shipped["topology"]
    by_group = {g.name: g for g in topo.groups}
    cases = {c.case_id: c for c in topo.cases}
    two = {(cases[i].tp, cases[i].etp, cases[i].dp) for i in by_group["2 GPUs"].case_ids}
    assert two == {(1, 1, 2), (1, 2, 2), (2, 2, 1)}
    assert {cases[i].world_size for i in by_group["4 GPUs"].case_ids} == {4}
    assert {cases[i].world_size for i in by_group["8 GPUs"].case_ids} == {8}
    assert "needs_8_gpus" in by_group["8 GPUs"].tags
    assert topo.max_world_size == 8
    assert topo.group_of(by_group["4 GPUs"].case_ids[0]).name == "4 GPUs"


# ------------------------------------------------------------------ format features
def test_ranges(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        num_tokens = {start = 256, stop = 4096, mul = 4}
        dim = {start = 64, stop = 160, step = 32}
        num_heads = [1, {pow2 = [2, 3]}]
        compute_us = 0
    """)
    assert sorted({c.num_tokens for c in cases}) == [256, 1024, 4096]
    assert sorted({c.dim for c in cases}) == [64, 96, 128, 160]
    assert sorted({c.num_heads for c in cases}) == [1, 4, 8]
    assert len(cases) == 3 * 4 * 3


def test_float_range_and_size_range(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        kind = "step"
        compute_us = {start = 0, stop = 1, step = 0.25}
        table_bytes = {start = "1MiB", stop = "4MiB", mul = 2}
        dtype = "fp8"
        dim = 128
    """)
    assert sorted({c.compute_us for c in cases}) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert sorted({c.vocab_size for c in cases}) == [8192, 16384, 32768]


def test_table_bytes_gives_vocab_and_matches_case_row_bytes(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        table_bytes = "1GiB"
        variants = [{dtype = "fp8", dim = 160}, {dtype = "bf16", dim = 128}, {dtype = "fp32", dim = 100}]
    """)
    assert [c.vocab_size for c in cases] == [GiB // 160, GiB // 256, GiB // 400]
    for c in cases:
        assert c.row_bytes == c.dim * DTYPE_BYTES[c.dtype]  # our table agrees with Case (torch)


def test_exclusions(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        impl = ["device", "pinned_uva"]
        prefetch = ["off", "on"]
        ids = ["uniform", "zipf:1.1", "ngram"]
        num_heads = 2
        exclude = [{impl = "device", prefetch = true}, {impl = "pinned_uva", ids = ["zipf:1.1", "ngram"]}]
    """)
    got = {(c.impl, c.prefetch, c.ids) for c in cases}
    assert got == {("device", False, "uniform"), ("device", False, "zipf:1.1"), ("device", False, "ngram"),
                   ("pinned_uva", False, "uniform"), ("pinned_uva", True, "uniform")}


def test_exclude_by_table_bytes(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        impl = ["device", "pinned_uva"]
        table_bytes = ["1MiB", "2MiB"]
        exclude = [{impl = "device", table_bytes = "2MiB"}]
    """)
    assert {(c.impl, table_bytes(c)) for c in cases} == {("device", MiB), ("pinned_uva", MiB), ("pinned_uva", 2 * MiB)}


def test_constraints(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        tp = [1, 2, 4]
        etp = [1, 2, 4]
        dp = [1, 2, 4]
        num_tokens = [8, 64]
        num_heads = 4
        constraints = ["valid_topology", "world_size <= 4", "num_ids * etp <= 512", "impl in ['device']"]
    """)
    assert cases
    for c in cases:
        assert c.etp % c.tp == 0 and c.tp * c.dp <= 4 and c.num_tokens * c.num_heads * c.etp <= 512
    topos = {(c.tp, c.etp, c.dp) for c in cases}
    assert (1, 2, 2) in topos and (2, 2, 1) in topos and (2, 2, 2) in topos
    assert (2, 1, 1) not in topos and (1, 4, 1) not in topos and (4, 4, 1) in topos
    assert not any(c.num_tokens == 64 and c.etp > 2 for c in cases)


def test_constraint_operators(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        num_tokens = {pow2 = [1, 6]}
        graph = ["eager", "full"]
        constraints = ["not (graph == 'full' and num_tokens > 4) and num_tokens % 4 == 0 or num_tokens == 2",
                       "2 ** 1 <= num_tokens"]
    """)
    assert {(c.graph, c.num_tokens) for c in cases} == {
        ("eager", 2), ("full", 2), ("eager", 4), ("full", 4), ("eager", 8), ("eager", 16), ("eager", 32), ("eager", 64)}


def test_defaults_variants_and_extra_axes(tmp_path):
    suite = load_suite(write(tmp_path, """
        [defaults]
        dtype = "fp8"
        dim = 160
        vocab_size = 1000
        [[group]]
        name = "a"
        variants = [{dtype = "bf16"}, {dim = 64}]
        [[group]]
        name = "b"
        table_bytes = "1MiB"
        extra.block = [32, 64]
        extra.mode = "x"
    """))
    a = [c for c in suite.cases if c.case_id in suite.groups[0].case_ids]
    assert {(c.dtype, c.dim, c.vocab_size) for c in a} == {("bf16", 160, 1000), ("fp8", 64, 1000)}
    b = [c for c in suite.cases if c.case_id in suite.groups[1].case_ids]
    assert {c.vocab_size for c in b} == {MiB // 160}  # group size replaces the default vocab_size
    assert {dict(c.extra)["block"] for c in b} == {32, 64} and {dict(c.extra)["mode"] for c in b} == {"x"}


def test_duplicates_across_groups_are_kept_once(tmp_path):
    suite = load_suite(write(tmp_path, """
        [[group]]
        name = "first"
        impl = ["device", "pinned_uva"]
        [[group]]
        name = "second"
        impl = "pinned_uva"
        prefetch = ["off", "on"]
    """))
    assert len(suite.cases) == 3
    assert len(suite.groups[0].case_ids) == 2 and len(suite.groups[1].case_ids) == 1
    assert suite.group_of(suite.groups[1].case_ids[0]).name == "second"


def test_step_only_axes_reset_for_lookups(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        kind = ["lookup", "step"]
        compute_us = [0, 50]
        hidden = [1024, 2048]
    """)
    assert sorted((c.kind, c.compute_us, c.hidden) for c in cases) == [
        ("lookup", 0.0, 4096), ("step", 0.0, 1024), ("step", 0.0, 2048), ("step", 50.0, 1024), ("step", 50.0, 2048)]


def test_equivalent_spellings_give_one_case(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        prefetch = ["on", true]
        ids = ["zipf:1.10", "zipf:1.1"]
        compute_us = [1, 1.0]
        kind = "step"
    """)
    assert len(cases) == 1
    assert cases[0].prefetch is True and cases[0].ids == "zipf:1.1" and cases[0].compute_us == 1.0


def test_impl_import_path_is_accepted(tmp_path):
    cases = cases_of(tmp_path, """
        [[group]]
        impl = ["device", "tests.plugin_backends:WrongRowsBackend"]
        kernel = ["", "torch_masked"]
    """)
    assert {c.impl for c in cases} == {"device", "tests.plugin_backends:WrongRowsBackend"} and len(cases) == 4


# ------------------------------------------------------------------ case ids
def test_case_ids_are_stable(tmp_path):
    first = load_suite("smoke")
    again = load_suite("smoke")
    assert [c.case_id for c in first.cases] == [c.case_id for c in again.cases]
    copy = tmp_path / "renamed.toml"
    shutil.copy(REPO_SUITES_DIR / "smoke.toml", copy)
    assert [c.case_id for c in load_suite(copy).cases] == [c.case_id for c in first.cases]
    for name in ("default", "overlap", "topology"):
        ids = [c.case_id for c in load_suite(name).cases]
        assert len(ids) == len(set(ids))


def test_case_json_round_trips():
    case = load_suite("smoke").cases[0]
    record = case_json(case)
    assert record["case_id"] == case.case_id
    assert set(record) == {"case_id"} | {f.name for f in dataclasses.fields(Case)}
    axes = {k: v for k, v in record.items() if k != "case_id"}
    assert Case.from_axes(axes) == case


def test_format_cases_is_an_aligned_table():
    cases = load_suite("smoke").cases
    text = format_cases(cases)
    lines = text.splitlines()
    assert lines[0].startswith("common: ") and "vocab_size=4096" in lines[0]
    header, rule, rows, footer = lines[1], lines[2], lines[3:-1], lines[-1]
    assert footer == f"{len(cases)} cases" and len(rows) == len(cases)
    col = header.index("case_id")
    for row, case in zip(rows, cases):
        assert row[col:].startswith(case.case_id)
    dtype_col = header.index("dtype")
    assert {row[dtype_col:].split()[0] for row in rows} == {"fp32", "fp16", "bf16", "fp8"}
    assert set(rule.replace(" ", "")) == {"-"}
    assert format_cases([]) == "(no cases)"
    assert "e+" not in text and format_bytes((1 << 30) // 160 * 160) == "1 GiB"
    assert format_bytes(640 * 1024) == "640 KiB" and format_bytes(12) == "12 B"


# ------------------------------------------------------------------ lookup by name
def test_lookup_by_name_and_env_dir(tmp_path, monkeypatch):
    write(tmp_path, "[[group]]\nimpl = 'device'\n", name="mine.toml")
    monkeypatch.setenv("PLE_BENCH_SUITES_DIR", str(tmp_path))
    assert load_suite("mine").path == tmp_path / "mine.toml"
    assert load_suite("smoke").path == REPO_SUITES_DIR / "smoke.toml"
    with pytest.raises(SuiteError, match=r"unknown suite 'nope'.*smoke"):
        load_suite("nope")
    with pytest.raises(SuiteError, match="no such suite file"):
        load_suite(tmp_path / "missing.toml")


# ------------------------------------------------------------------ validation
BAD = [
    # (group body, [substrings the one message must contain])
    ("dtyp = 'fp8'", ["unknown axis 'dtyp'", "allowed:", "dtype", "table_bytes"]),
    ("dtype = 'fp64'", ["key 'dtype'", "unknown dtype 'fp64'", "fp32, fp16, bf16, fp8"]),
    ("graph = 'partial'", ["key 'graph'", "unknown graph mode 'partial'", "eager, breakable, full"]),
    ("kind = 'train'", ["key 'kind'", "'train'", "lookup, step"]),
    ("impl = 'nosuch'", ["key 'impl'", "'nosuch'", "device", "pinned_uva", "package.module:Class"]),
    # an import path is imported at load: one that does not import is a bad suite, never a skipped case
    ("impl = 'tests.no_such_module:X'", ["key 'impl'", "'tests.no_such_module:X'", "does not load",
                                         "cannot import backend module 'tests.no_such_module'"]),
    ("impl = 'tests.plugin_backends:Missing'", ["key 'impl'", "'tests.plugin_backends:Missing'",
                                                "has no attribute 'Missing'"]),
    ("impl = 'tests.plugin_backends:NotABackend'", ["key 'impl'", "'tests.plugin_backends:NotABackend'",
                                                    "not a subclass of ple_bench.backends.PLEEmbedding"]),
    ("impl = ['device', 'tests.plugin_backends:NotABackend']", ["key 'impl'", "NotABackend", "PLEEmbedding"]),
    ("kernel = 'fastest'", ["key 'kernel'", "'fastest'", "torch_masked"]),
    ("prefetch = 'maybe'", ["key 'prefetch'", "'on', 'off'"]),
    ("ids = 'zipf:0'", ["key 'ids'", "a > 0"]),
    ("ids = 'gauss'", ["key 'ids'", "unknown ids spec 'gauss'", "uniform", "ngram"]),
    ("grid_frac = 1.5", ["key 'grid_frac'", "<= 1"]),
    ("num_tokens = 0", ["key 'num_tokens'", ">= 1"]),
    ("num_tokens = 2.5", ["key 'num_tokens'", "not an integer"]),
    ("num_tokens = []", ["key 'num_tokens'", "empty list"]),
    ("num_tokens = [[1, 2]]", ["key 'num_tokens'", "nested list"]),
    ("num_tokens = {start = 10, stop = 1, mul = 2}", ["key 'num_tokens'", "bad range", "start > stop"]),
    ("num_tokens = {start = 1, stop = 10, mul = 1}", ["key 'num_tokens'", "mul must be a number > 1"]),
    ("num_tokens = {start = 1, stop = 10, step = 0}", ["key 'num_tokens'", "step must be a number > 0"]),
    ("num_tokens = {start = 1, stop = 10}", ["key 'num_tokens'", "allowed range tables", "pow2"]),
    ("num_tokens = {pow2 = [5, 3]}", ["key 'num_tokens'", "pow2 takes [lo, hi]"]),
    ("num_tokens = {start = 1, stop = 100000, step = 1}", ["key 'num_tokens'", "more than 10000 values"]),
    ("table_bytes = '12 parsecs'", ["key 'table_bytes'", "'64MiB'"]),
    ("table_bytes = '1MiB'\nvocab_size = 10", ["'vocab_size' and 'table_bytes'", "one of them"]),
    ("table_bytes = 100\ndim = 128", ["key 'table_bytes'", "less than one row"]),
    ("tp = 2\netp = 1\ndp = 2", ["'tp'/'etp'/'dp'", "ETP size must be divisible by TP size", "valid_topology"]),
    ("tp = 1\netp = 2\ndp = 1", ["'tp'/'etp'/'dp'", "larger than the world size"]),
    ("tp = 1\netp = 2\ndp = 3", ["'tp'/'etp'/'dp'", "not a multiple of ETP/TP"]),
    ("ids = 'ngram'\nnum_heads = 3", ["'ids'/'num_heads'", "multiple of 2", "num_heads=3"]),
    ("vocab_size = 2\nnum_heads = 4", ["key 'vocab_size'", "fewer than num_heads=4"]),
    ("impl = 'device'\nexclude = [{impl = 'device'}]", ["zero cases"]),
    ("num_tokens = 8\nconstraints = ['num_tokens > 8']", ["zero cases"]),
    ("constraints = ['__import__(\"os\").system(\"true\")']", ["constraints[1]", "Call is not allowed", "valid_topology"]),
    ("constraints = ['tokens > 2']", ["constraints[1]", "unknown name 'tokens'", "num_tokens"]),
    ("constraints = ['num_tokens >']", ["constraints[1]", "cannot parse constraint"]),
    ("constraints = ['num_tokens // (tp - 1) > 0']", ["constraint 'num_tokens // (tp - 1) > 0' failed", "division"]),
    ("constraints = [3]", ["constraints[1]", "not a string"]),
    ("exclude = [{dtyp = 'fp8'}]", ["exclude[1]", "unknown axis 'dtyp'"]),
    ("exclude = {impl = 'device'}", ["key 'exclude'", "must be a list"]),
    ("repeat = 4", ["key 'repeat'", "must be a table", "processes = 4, rounds = 3"]),
    ("repeat = { processes = 0 }", ["key 'repeat.processes'", "0", "integer in [1, 64]"]),
    ("repeat = { processes = 2, rounds = 1.5 }", ["key 'repeat.rounds'", "integer in [1, 64]"]),
    ("repeat = { process = 2 }", ["key 'repeat.process'", "unknown", "processes, rounds, target_pct, most"]),
    ("repeat = { processes = 4, target_pct = 0 }", ["key 'repeat.target_pct'", "a number in [0.1, 50.0]"]),
    ("repeat = { processes = 4, most = 8 }", ["key 'repeat.most'", "without 'repeat.target_pct'"]),
    ("repeat = { processes = 4, target_pct = 2, most = 3 }", ["key 'repeat.most'", "less than repeat.processes"]),
    ("tp = 1\nvariants = [{tp = 2, etp = 2}]", ["variants[1] key 'tp'", "also given as a group axis"]),
    ("variants = [{tp = [1, 2]}]", ["variants[1] key 'tp'", "one value per variant"]),
    ("tags = 'x'", ["key 'tags'", "list of strings"]),
    ("extra = 3", ["key 'extra'", "extra.block"]),
    ("extra.block = [{a = 1}]", ["key 'extra.block'", "allowed range tables"]),
]


@pytest.mark.parametrize("body, expected", BAD, ids=[b for b, _ in BAD])
def test_bad_group_is_one_clear_error(tmp_path, body, expected):
    path = write(tmp_path, "[[group]]\nname = 'g'\n" + body + "\n", name="bad.toml")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    for part in expected:
        assert part in message, (part, message)
    assert "[[group]] #1 ('g')" in message  # the place in the file


def test_impl_import_path_is_imported_at_load(tmp_path, monkeypatch):
    """A plug-in backend is imported when the suite loads: one whose module raises while importing
    is a SuiteError naming the file, the group and the import path."""
    (tmp_path / "exploding_backend.py").write_text("raise RuntimeError('planted import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, "[[group]]\nname = 'mine'\nimpl = 'exploding_backend:Backend'\n", name="bad.toml")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(f"{path}: [[group]] #1 ('mine'): key 'impl'")
    assert "'exploding_backend:Backend'" in message and "planted import-time failure" in message


BAD_SUITE = [
    ("[[group]]\nimpl = 'device'\n", ["[suite]", "missing [suite] table"]),
    ("[suite]\n[[group]]\nimpl = 'device'\n", ["[suite]", "key 'description'", "required"]),
    ("[suite]\ndescription = 'x'\n", ["no [[group]] tables"]),
    ("[suite]\ndescription = 'x'\n[grup]\n[[group]]\n", ["unknown table 'grup'", "suite, defaults, group"]),
    ("[suite]\ndescription = 'x'\nauthor = 'me'\n[[group]]\n", ["[suite]", "unknown key 'author'", "gpu_only"]),
    ("[suite]\ndescription = 'x'\ngpu_only = 'yes'\n[[group]]\n", ["key 'gpu_only'", "true or false"]),
    ("[suite]\ndescription = 'x'\nfunctional_fallback = 'nope'\n[[group]]\n",
     ["key 'functional_fallback'", "unknown suite 'nope'", "smoke"]),
    ("[suite]\ndescription = 'x'\n[suite.timing]\nwarmup = 3\n[[group]]\n",
     ["[suite.timing]", "unknown key 'warmup'", "warmup_ms", "max_noise", "cold_l2"]),
    ("[suite]\ndescription = 'x'\n[suite.timing]\nmin_samples = 0\n[[group]]\n",
     ["[suite.timing]", "key 'min_samples'", "an integer >= 1"]),
    ("[suite]\ndescription = 'x'\n[suite.timing]\ncold_l2 = 1\n[[group]]\n", ["key 'cold_l2'", "true or false"]),
    ("[suite]\ndescription = 'x'\n[suite.timing]\nmin_samples = 10\nmax_samples = 5\n[[group]]\n",
     ["key 'max_samples'", "less than min_samples"]),
    ("[suite]\ndescription = 'x'\n[defaults]\nname = 'x'\n[[group]]\n", ["[defaults]", "unknown axis 'name'"]),
    ("[suite\ndescription = 'x'\n", ["not valid TOML"]),
]


@pytest.mark.parametrize("text, expected", BAD_SUITE, ids=[t.replace("\n", " ")[:60] for t, _ in BAD_SUITE])
def test_bad_suite_is_one_clear_error(tmp_path, text, expected):
    path = write(tmp_path, text, name="bad.toml", header=False)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    for part in expected:
        assert part in message, (part, message)


def test_timing_keys_match_the_timing_policy(shipped):
    from ple_bench.measure import TimingPolicy
    from ple_bench.spec.axes import TIMING

    assert set(TIMING) == {f.name for f in dataclasses.fields(TimingPolicy)}
    for suite in shipped.values():
        TimingPolicy.from_dict(suite.timing)  # every shipped policy is one the runner accepts


def test_timing_is_passed_through(tmp_path):
    suite = load_suite(write(tmp_path, """
        notes = "n"
        gpu_only = true
        functional_fallback = "smoke"
        [suite.timing]
        warmup_ms = 5
        min_samples = 3
        max_samples = 30
        max_noise = 0.05
        cold_l2 = true
        hot = false
        graph = true
        [[group]]
        impl = "device"
    """))
    assert suite.timing == {"warmup_ms": 5.0, "min_samples": 3, "max_samples": 30, "max_noise": 0.05,
                            "cold_l2": True, "hot": False, "graph": True}
    assert suite.gpu_only and suite.functional_fallback == "smoke" and suite.notes == "n"


def test_oversized_product_is_refused(tmp_path):
    path = write(tmp_path, """
        [[group]]
        num_tokens = {start = 1, stop = 1000, step = 1}
        dim = {start = 1, stop = 1000, step = 1}
    """)
    with pytest.raises(SuiteError, match="at most 200000"):
        load_suite(path)


def test_h2d_background_is_a_step_axis_that_names_its_cases(tmp_path):
    cases = cases_of(tmp_path, """
        [defaults]
        vocab_size = 4096
        dim = 64
        [[group]]
        kind = ["lookup", "step"]
        h2d_background = [false, "on"]
        """)
    steps = [c for c in cases if c.kind == "step"]
    assert sorted(c.h2d_background for c in steps) == [False, True]
    assert [".h2dbg" in c.case_id for c in steps] == [c.h2d_background for c in steps]
    # a lookup has no step measurements to run it beside: the axis leaves the lookup cases
    assert [c.h2d_background for c in cases if c.kind == "lookup"] == [False]
    with pytest.raises(SuiteError, match="h2d_background"):
        cases_of(tmp_path, """
            [[group]]
            kind = "step"
            h2d_background = "sometimes"
            """)
