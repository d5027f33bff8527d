"""Both backends (device, pinned_uva) x every storage dtype against a plain
full-table reference on random data: whole-table lookups, each ETP rank's
masked shard lookup, synthetic tables, the two lookup kernels (the Triton one
under the interpreter), every error path, and the backend registry."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import (
    DTYPES, PLEEmbedding, ShardSpec, backend_names, get_backend, get_kernel, synthetic_rows,
)
from ple_bench.backends.formats import int_view
from ple_bench.backends.kernels import kernel_names
from ple_bench.backends.registry import BUILTIN, BackendImportError
from ple_bench.parallel import Groups, Topology

from ._reference import (
    POISON_BYTE, assert_bytes_equal, bytes_of, full_lookup, masked_lookup, poisoned, random_ids,
    random_table,
)

BACKENDS = ["device", "pinned_uva"]
DTYPE_NAMES = ["fp32", "bf16", "fp16", "fp8"]
HAS_CUDA = torch.cuda.is_available()


def make(backend, num, dim, dtype="bf16", **kw):
    return get_backend(backend)(num, dim, dtype=dtype, device="cpu", **kw)


def _loaded(backend, dtype_name, num, dim, heads, seed=0, **kw):
    full = random_table(num, dim, DTYPES[dtype_name], seed=seed)
    emb = make(backend, num, dim, dtype_name, num_heads=heads, **kw)
    emb.load_full_table(full, scale=0.25 if dtype_name == "fp8" else None)
    return emb, full


# ----------------------------------------------------------------- whole table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
@pytest.mark.parametrize(
    "num, dim, heads, padding",
    [(1000, 37, 3, 64), (77, 160, 1, 7), (130, 5, 4, 128)],  # vocab not a multiple of padding
    ids=["v1000-d37-h3", "v77-d160-h1", "v130-d5-h4"],
)
def test_lookup_matches_full_table(backend, dtype_name, num, dim, heads, padding):
    emb, full = _loaded(backend, dtype_name, num, dim, heads, seed=num + dim,
                        max_tokens=16, padding_size=padding)
    for step, (tokens, id_dtype) in enumerate([(9, torch.int64), (16, torch.int32), (1, torch.int64)]):
        ids = random_ids(tokens, heads, num, seed=step, dtype=id_dtype)
        expected = full_lookup(full, ids)
        assert_bytes_equal(emb.lookup(ids), expected, f"lookup step {step}")
        emb.start_prefetch(ids)
        out = poisoned(expected.shape, expected.dtype)
        assert emb.finalize(out=out) is out
        assert_bytes_equal(out, expected, f"prefetch step {step}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_finalize_result_survives_the_next_prefetch(backend):
    emb, full = _loaded(backend, "bf16", 500, 24, 2, max_tokens=8)
    ids_a = random_ids(8, 2, 500, seed=1)
    ids_b = random_ids(3, 2, 500, seed=2)
    emb.start_prefetch(ids_a)
    first = emb.finalize()
    emb.start_prefetch(ids_b)
    second = emb.finalize()
    assert_bytes_equal(first, full_lookup(full, ids_a), "first result after a second prefetch")
    assert_bytes_equal(second, full_lookup(full, ids_b), "second (smaller) batch")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_empty_batch(backend, dtype_name):
    emb, _ = _loaded(backend, dtype_name, 100, 12, 3, max_tokens=4)
    ids = torch.empty(0, 3, dtype=torch.int64)
    rows = emb.lookup(ids)
    assert rows.shape == (0, 36) and rows.dtype == DTYPES[dtype_name]
    emb.start_prefetch(ids)
    assert emb.finalize().shape == (0, 36)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_synthetic_fill_matches_synthetic_rows(backend, dtype_name):
    num, dim, heads = 203, 19, 2
    emb = make(backend, num, dim, dtype_name, num_heads=heads, max_tokens=12)
    emb.fill_synthetic(seed=5, scale=0.5 if dtype_name == "fp8" else None)
    emb.check_loaded()
    dtype = DTYPES[dtype_name]
    ids = random_ids(12, heads, num, seed=3)
    expected = synthetic_rows(ids.reshape(-1), dim, 5, dtype).reshape(12, heads * dim)
    assert_bytes_equal(emb.lookup(ids), expected, "synthetic lookup")
    emb.start_prefetch(ids)
    out = poisoned(expected.shape, dtype)
    emb.finalize(out=out)
    assert_bytes_equal(out, expected, "synthetic prefetch")
    # the whole table, and the padding rows (203 -> 256) are loud
    s = emb.shard
    assert_bytes_equal(emb.weight[: s.num_valid],
                       synthetic_rows(torch.arange(num), dim, 5, dtype), "synthetic table")
    pad = emb.weight[s.num_valid:]
    assert pad.shape[0] == 256 - num
    if dtype == torch.float8_e4m3fn:
        assert bool((bytes_of(pad) == 0x7F).all())
    else:
        assert bool(pad.isnan().all())


# ----------------------------------------------------------------- ETP shards in one process

SHARD_TOPOLOGIES = [(2, 2, 1), (1, 2, 2), (2, 4, 2), (1, 4, 4), (1, 2, 4), (1, 8, 8)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
@pytest.mark.parametrize("topo", SHARD_TOPOLOGIES, ids=lambda t: "tp%d-etp%d-dp%d" % t)
@pytest.mark.parametrize("num, padding", [(1001, 64), (70, 64)])  # 70: trailing ranks own nothing
def test_each_etp_rank_looks_up_its_shard(backend, dtype_name, topo, num, padding):
    """Every rank of the first ETP group, built for its rank without process
    groups: its masked lookup is the full table restricted to its shard (zero
    bytes elsewhere), and the integer sum over the group is the full lookup."""
    tp, etp, dp = topo
    topology = Topology(tp, etp, dp)
    dim, heads = 11, 3
    dtype = DTYPES[dtype_name]
    full = random_table(num, dim, dtype, seed=etp * 31 + num)
    synthetic_full = synthetic_rows(torch.arange(num), dim, etp, dtype)
    ids = random_ids(10, heads, num, seed=etp)
    total = torch.zeros(10 * heads * dim * dtype.itemsize, dtype=torch.int8)
    float_total = torch.zeros(10, heads, dim, dtype=torch.float32)
    covered = []
    for rank in topology.etp_group_ranks(0):
        groups = Groups(topology=topology, rank=rank)
        emb = make(backend, num, dim, dtype_name, num_heads=heads, padding_size=padding, groups=groups)
        emb.load_full_table(full)
        s = emb.shard
        assert s == ShardSpec.compute(num, padding, etp, topology.coords(rank).etp_rank)
        covered.extend(range(s.vocab_start, s.vocab_end))
        out = poisoned((10, heads, dim), dtype)
        emb.local_lookup(ids, out=out)
        assert_bytes_equal(out, masked_lookup(full, ids, s.vocab_start, s.vocab_end),
                           f"rank {rank} shard [{s.vocab_start}, {s.vocab_end})")
        total += bytes_of(out).view(torch.int8)
        float_total += out.float()
        # the same shard filled with synthetic rows (fill_synthetic offsets by vocab_start)
        emb.fill_synthetic(seed=etp)
        syn = poisoned((10, heads, dim), dtype)
        emb.local_lookup(ids, out=syn)
        assert_bytes_equal(syn, masked_lookup(synthetic_full, ids, s.vocab_start, s.vocab_end),
                           f"rank {rank} synthetic shard")
    assert covered == list(range(num)), "the shards must tile the vocabulary once"
    expected = full_lookup(full, ids)
    assert torch.equal(total, bytes_of(expected).view(torch.int8)), "integer sum over ETP ranks"
    # the data holds -0.0, so a float reduce would not have been byte-exact
    assert not torch.equal(bytes_of(float_total.to(dtype)), bytes_of(expected))


@pytest.mark.parametrize("etp, num, padding", [(4, 70, 64), (8, 70, 64), (3, 1000, 7), (2, 1, 1)])
def test_shard_geometry(etp, num, padding):
    padded = -(-num // padding) * padding
    specs = [ShardSpec.compute(num, padding, etp, r) for r in range(etp)]
    assert all(s.padded_vocab == padded and s.rows_per_rank == -(-padded // etp) for s in specs)
    assert specs[0].vocab_start == 0
    assert sum(s.num_valid for s in specs) == num
    for a, b in zip(specs, specs[1:]):
        assert b.vocab_start == a.vocab_start + a.rows_per_rank
        assert a.vocab_end <= b.vocab_start or b.num_valid == 0


# ----------------------------------------------------------------- kernels


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
@pytest.mark.parametrize("dim", [1, 5, 37, 64, 160])
def test_triton_kernel_matches_torch_masked(dtype_name, dim):
    """The Triton reference kernel (interpreted on CPU) and the masked
    index_select on the same shard and ids, both into poisoned outputs."""
    dtype = DTYPES[dtype_name]
    rows, start = 50, 200  # shard of rows [200, 250) of a larger table
    shard = random_table(rows, dim, dtype, seed=dim)
    ids = torch.cat([
        torch.randint(0, 400, (40,)),
        torch.tensor([0, start - 1, start, start + rows - 1, start + rows, 399]),
    ])
    expected = torch.zeros(ids.numel(), dim, dtype=dtype)
    owned = (ids >= start) & (ids < start + rows)
    expected[owned] = shard[ids[owned] - start]
    outs = {}
    for name in ("torch_masked", "triton_reference"):
        out = poisoned((ids.numel(), dim), dtype)
        get_kernel(name)(int_view(shard), ids, int_view(out), start, start + rows)
        assert_bytes_equal(out, expected, name)
        outs[name] = out
    assert_bytes_equal(outs["triton_reference"], outs["torch_masked"], "triton vs torch_masked")


@pytest.mark.parametrize("name", ["torch_masked", "triton_reference"])
def test_kernels_with_no_ids_write_nothing(name):
    shard = random_table(10, 8, torch.bfloat16, seed=0)
    out = poisoned((0, 8), torch.bfloat16)
    get_kernel(name)(int_view(shard), torch.empty(0, dtype=torch.int64), int_view(out), 0, 10)
    assert out.numel() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", ["torch_masked", "triton_reference", "torch_index"])
def test_every_backend_with_every_kernel(backend, kernel):
    emb, full = _loaded(backend, "fp8", 300, 21, 2, max_tokens=6, kernel=kernel)
    assert emb.kernel_name == kernel
    ids = random_ids(6, 2, 300, seed=9, dtype=torch.int32)
    assert_bytes_equal(emb.lookup(ids), full_lookup(full, ids), f"{backend} with {kernel}")


def test_torch_index_is_the_plain_gather_and_refuses_ids_outside_its_shard():
    shard = random_table(50, 7, torch.bfloat16, seed=4)
    ids = torch.tensor([200, 249, 213, 200])
    out = poisoned((4, 7), torch.bfloat16)
    get_kernel("torch_index")(int_view(shard), ids, int_view(out), 200, 250)
    assert_bytes_equal(out, shard[ids - 200], "torch_index")
    with pytest.raises(IndexError):
        get_kernel("torch_index")(int_view(shard), torch.tensor([250]), int_view(out[:1]), 200, 250)


def test_default_kernels_and_registry():
    assert {"torch_masked", "triton_reference"} <= set(kernel_names())
    # on a GPU the device table's default is the one-kernel triton_reference (the fastest correct
    # resident gather: the reference offloaded steps are held against); on a CPU the interpreter
    # would take seconds per lookup, so functional mode keeps torch_masked
    assert get_backend("device").default_kernel == "triton_reference"
    assert get_backend("device").cpu_kernel == "torch_masked"
    assert make("device", 10, 4).kernel_name == "torch_masked"  # make() builds on the CPU
    assert make("pinned_uva", 10, 4).kernel_name == "triton_reference"
    with pytest.raises(ValueError, match="unknown lookup kernel 'nope'"):
        make("device", 10, 4, kernel="nope")


# ----------------------------------------------------------------- error paths


@pytest.mark.parametrize("backend", BACKENDS)
def test_finalize_without_prefetch(backend):
    emb, _ = _loaded(backend, "bf16", 50, 8, 1, max_tokens=4)
    with pytest.raises(RuntimeError, match="requires a prior start_prefetch"):
        emb.finalize()
    emb.start_prefetch(torch.tensor([[1], [2]]))
    emb.finalize()
    with pytest.raises(RuntimeError, match="requires a prior start_prefetch"):
        emb.finalize()  # a prefetch is consumed once


def test_batch_larger_than_prefetch_buffer():
    emb, _ = _loaded("pinned_uva", "fp8", 50, 8, 2, max_tokens=4)
    with pytest.raises(ValueError, match=r"holds 4 rows.*needs 5"):
        emb.start_prefetch(random_ids(5, 2, 50, seed=0))


def test_prefetch_with_max_tokens_zero():
    emb, full = _loaded("pinned_uva", "bf16", 50, 8, 1)  # max_tokens defaults to 0
    with pytest.raises(ValueError, match="max_tokens > 0"):
        emb.start_prefetch(torch.tensor([[3]]))
    with pytest.raises(RuntimeError, match="requires a prior start_prefetch"):
        emb.finalize()
    # the synchronous lookup needs no buffer, and the device backend no max_tokens
    assert_bytes_equal(emb.lookup(torch.tensor([[3]])), full[3:4], "pinned sync lookup")
    dev, full = _loaded("device", "bf16", 50, 8, 1)
    dev.start_prefetch(torch.tensor([[3]]))
    assert_bytes_equal(dev.finalize(), full[3:4], "device prefetch with max_tokens=0")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_pinned_on_cuda_without_cuda():
    with pytest.raises(RuntimeError, match="requires UVA support"):
        get_backend("pinned_uva")(10, 4, dtype="bf16", device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "ids, match",
    [
        (torch.zeros(4, dtype=torch.int64), r"ids must be \[tokens, 2\]"),
        (torch.zeros(4, 3, dtype=torch.int64), r"ids must be \[tokens, 2\]"),
        (torch.zeros(1, 4, 2, dtype=torch.int64), r"ids must be \[tokens, 2\]"),
        (torch.zeros(4, 2, dtype=torch.float32), "int64 or int32"),
        (torch.zeros(4, 2, dtype=torch.int16), "int64 or int32"),
    ],
)
def test_bad_ids(backend, ids, match):
    emb, _ = _loaded(backend, "bf16", 50, 8, 2, max_tokens=8)
    with pytest.raises(ValueError, match=match):
        emb.lookup(ids)
    with pytest.raises(ValueError, match=match):
        emb.start_prefetch(ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dp_token_counts_required_when_etp_spans_dp(backend):
    groups = Groups(topology=Topology(tp=1, etp=2, dp=2), rank=1)
    emb, _ = _loaded(backend, "bf16", 50, 8, 1, max_tokens=8, groups=groups)
    ids = torch.tensor([[1], [2], [3]])
    for call in (emb.lookup, emb.start_prefetch):
        with pytest.raises(ValueError, match="pass dp_token_counts"):
            call(ids)
        with pytest.raises(ValueError, match="has 3 entries, expected DP=2"):
            call(ids, [1, 3, 2])
        with pytest.raises(ValueError, match=r"dp_token_counts\[1\]=2 but this rank has 3 tokens"):
            call(ids, [3, 2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_construction_arguments(backend):
    with pytest.raises(ValueError, match="unknown dtype 'fp4'"):
        make(backend, 10, 4, "fp4")
    with pytest.raises(ValueError, match="unsupported storage dtype"):
        make(backend, 10, 4, torch.int8)
    for kw, match in [({"num_heads": 0}, "num_heads"), ({"max_tokens": -1}, "max_tokens"),
                      ({"padding_size": 0}, "padding_size")]:
        with pytest.raises(ValueError, match=match):
            make(backend, 10, 4, **kw)
    with pytest.raises(ValueError, match="num_embeddings"):
        make(backend, 0, 4)
    with pytest.raises(ValueError, match="embedding_dim"):
        make(backend, 10, 2.5)
    emb = make(backend, 10, 4, max_tokens=2)
    with pytest.raises(ValueError, match=r"full table must be \(10, 4\)"):
        emb.load_full_table(torch.zeros(10, 5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_finalize_into_a_wrong_output(backend):
    emb, _ = _loaded(backend, "bf16", 50, 8, 2, max_tokens=4)
    emb.start_prefetch(random_ids(3, 2, 50, seed=0))
    with pytest.raises(ValueError, match=r"output must be \(3, 16\)"):
        emb.finalize(out=torch.empty(3, 15, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_lookup_into_writes_the_consumers_buffer_without_a_second_lookup(backend, monkeypatch):
    """The decode step's lookup (and finalize into ``out``) writes the rows straight into the
    step's buffer: no rows tensor copied in afterwards (the resident step a server runs has
    no such copy).  A backend with its own ``lookup`` keeps it, copied in."""
    emb, full = _loaded(backend, "fp8", 60, 12, 2, max_tokens=5)
    ids = random_ids(5, 2, 60, seed=3)
    out = poisoned((5, 24), emb.storage_dtype)
    monkeypatch.setattr(emb, "lookup", lambda *a, **k: pytest.fail("lookup_into called lookup"))
    assert emb.lookup_into(ids, out) is out
    assert_bytes_equal(out, full_lookup(full, ids), f"{backend} lookup_into")
    out2 = poisoned((5, 24), emb.storage_dtype)
    emb.start_prefetch(ids)
    assert emb.finalize(out=out2) is out2
    assert_bytes_equal(out2, full_lookup(full, ids), f"{backend} finalize(out=)")
    monkeypatch.undo()

    class OwnLookup(type(emb)):
        def lookup(self, ids, dp_token_counts=None):
            return super().lookup(ids, dp_token_counts)

    emb.__class__ = OwnLookup
    calls = []
    monkeypatch.setattr(emb, "lookup", lambda i, c=None: calls.append(1) or OwnLookup.lookup(emb, i, c))
    out3 = poisoned((5, 24), emb.storage_dtype)
    emb.lookup_into(ids, out3)
    assert calls == [1]
    assert_bytes_equal(out3, full_lookup(full, ids), f"{backend} lookup_into via its own lookup")
    with pytest.raises(ValueError, match=r"output must be \(5, 24\)"):
        emb.lookup_into(ids, torch.empty(5, 23, dtype=emb.storage_dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_scale_must_be_set(backend):
    emb = make(backend, 20, 4, "fp8")
    emb.fill_synthetic(seed=1)  # no scale given
    with pytest.raises(ValueError, match="missing its global scale"):
        emb.check_loaded()
    emb.set_scale(0.5)
    emb.check_loaded()
    bf = make(backend, 20, 4, "bf16")
    with pytest.raises(ValueError, match="has no scale"):
        bf.set_scale(0.5)
    bf.check_loaded()  # unquantized tables need none


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_dequantize_through_the_backend(backend):
    emb, full = _loaded(backend, "fp8", 64, 10, 2, max_tokens=5)  # scale 0.25: exact
    ids = random_ids(5, 2, 64, seed=4)
    rows = emb.lookup(ids)
    for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
        acts = emb.dequantize(rows, out_dtype)
        assert acts.dtype == out_dtype and acts.shape == rows.shape
        expected = (full_lookup(full, ids).double() * 0.25).to(out_dtype)
        assert_bytes_equal(acts, expected, f"dequantize to {out_dtype}")


# ----------------------------------------------------------------- registry


class MyBackend(PLEEmbedding):
    """A user backend given by import path: the table in host memory, the
    built-in lookup path."""

    def allocate_table(self, rows, dim, dtype):
        return torch.empty(rows, dim, dtype=dtype)


class NotABackend:
    pass


def not_a_class():
    return None


def test_backend_names():
    assert {"device", "pinned_uva"} <= set(backend_names())
    assert get_backend("device").name == "device"
    assert get_backend("pinned_uva").supports_prefetch and not get_backend("device").supports_prefetch


def test_unknown_backend_name():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; known: \[.*'pinned_host_flag'.*import path"):
        get_backend("nope")


def test_every_builtin_loads_as_the_class_its_entry_names():
    assert backend_names() == sorted(BUILTIN)
    for impl, path in BUILTIN.items():
        cls = get_backend(impl)
        assert f"{cls.__module__}:{cls.__qualname__}" == path and cls.name == impl


def test_a_builtin_that_fails_to_import_is_an_error_naming_it_and_its_cause(tmp_path, monkeypatch):
    """No built-in disappears silently: its import error is raised, with the impl and the cause."""
    (tmp_path / "ple_test_broken_path.py").write_text("import ple_test_no_such_dependency\n")
    (tmp_path / "ple_test_misnamed_path.py").write_text(
        "from ple_bench.backends.device import DeviceResidentEmbedding\n"
        "class Misnamed(DeviceResidentEmbedding):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = {"pinned_broken": "ple_test_broken_path:Broken", "pinned_misnamed": "ple_test_misnamed_path:Misnamed"}
    with pytest.raises(BackendImportError, match=r"'pinned_broken' does not import \(ple_test_broken_path\): "
                                                 r"ModuleNotFoundError: .*ple_test_no_such_dependency"):
        get_backend("pinned_broken", builtin=table)
    with pytest.raises(BackendImportError, match=r"'pinned_misnamed'.*declares name = 'device'"):
        get_backend("pinned_misnamed", builtin=table)
    with pytest.raises(ValueError, match=r"unknown backend 'device'; known: \['pinned_broken', 'pinned_misnamed'\]"):
        get_backend("device", builtin=table)


def test_backend_by_import_path():
    cls = get_backend("tests.test_backends:MyBackend")
    assert cls is MyBackend
    emb = cls(100, 6, dtype="fp16", num_heads=2)
    full = random_table(100, 6, torch.float16, seed=8)
    emb.load_full_table(full)
    ids = random_ids(4, 2, 100, seed=8)
    assert_bytes_equal(emb.lookup(ids), full_lookup(full, ids), "import-path backend")
    assert "MyBackend" not in backend_names()  # using it does not register it


@pytest.mark.parametrize(
    "path, match",
    [
        ("tests.test_backends:NotABackend", "not a subclass of ple_bench.backends.PLEEmbedding"),
        ("tests.test_backends:not_a_class", "not a subclass"),
        ("tests.test_backends:Missing", "has no attribute 'Missing'"),
        ("tests.no_such_module:X", "cannot import backend module 'tests.no_such_module'"),
    ],
)
def test_bad_import_paths_are_refused(path, match):
    with pytest.raises(ValueError, match=match):
        get_backend(path)


def test_poison_is_not_a_table_value():
    """The poison pattern must never be a value a reference can hold."""
    for dtype_name in DTYPE_NAMES:
        dtype = DTYPES[dtype_name]
        table = random_table(200, 16, dtype, seed=0)
        word = poisoned((1,), dtype)
        assert not bool((bytes_of(table).view(-1, dtype.itemsize) == bytes_of(word)).all(1).any())
        syn = synthetic_rows(torch.arange(5000), 16, 1, dtype)
        assert not bool((bytes_of(syn).view(-1, dtype.itemsize) == bytes_of(word)).all(1).any())
    assert POISON_BYTE == 0x7F
