"""The backend contract (ple_bench/backends/base.py): every built-in backend passes
the public checker (ple_bench.testing.check_backend), deliberately broken toy
backends fail it, the grid cap is a per-backend setting honoured by the kernels,
and no engine module outside backends/ reaches into a backend's privates or
probes it by name (an ast scan, checked itself on planted violations)."""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest
import torch

from ple_bench.run import executor
from ple_bench.backends import backend_names, fast_kernels, get_backend, synthetic_rows
from ple_bench.backends import base as base_mod
from ple_bench.backends.base import CAPABILITIES, RENAMED, PLEEmbedding
from ple_bench.backends.device import DeviceResidentEmbedding
from ple_bench.backends.kernels import grid_capped, takes_grid_cap, torch_masked_lookup
from ple_bench.backends.pinned_uva import PinnedUVAEmbedding
from ple_bench.testing import ContractError, check_backend

REPO = Path(__file__).resolve().parent.parent

# constructor keywords a built-in needs for the checker to exercise what it has
BUILTIN_KWARGS = {"pinned_hot_cache": {"cache_rows": 64}}


# ------------------------------------------------------------------ built-ins pass


@pytest.mark.parametrize("name", backend_names())
def test_every_builtin_backend_passes_the_contract(name):
    ran = check_backend(name, **BUILTIN_KWARGS.get(name, {}))
    assert ran[0] == "capabilities"
    assert [r.split(":")[0] for r in ran[1:]] == ["bf16", "fp8"]


def test_builtin_without_a_cache_and_other_dtypes():
    assert len(check_backend("pinned_hot_cache", dtypes=("fp32", "fp16"))) == 3  # cache_rows=0: all misses
    assert len(check_backend("pinned_uva", dtypes=("bf16",), kernel="dedup_triton")) == 2


def test_checker_refuses_an_unknown_dtype_as_the_callers_mistake():
    with pytest.raises(ValueError, match="dtypes: unknown \\['bf17'\\]"):
        check_backend("device", dtypes=("bf17",))


def test_checker_takes_a_class_and_an_import_path():
    assert check_backend(DeviceResidentEmbedding, dtypes=("bf16",))[0] == "capabilities"
    assert len(check_backend("tests.plugin_backends:VictimBackend", dtypes=("bf16",))) == 2


# ------------------------------------------------------------------ broken toys fail


class FlippedByte(DeviceResidentEmbedding):
    def lookup(self, ids, dp_token_counts=None):
        out = super().lookup(ids, dp_token_counts).clone()
        out.view(torch.uint8).view(-1)[-1] ^= 0x01
        return out


class IgnoresOut(DeviceResidentEmbedding):
    def local_lookup(self, ids, out=None):
        return super().local_lookup(ids, None)  # a fresh tensor; out keeps its poison


class StalePrefetch(PinnedUVAEmbedding):
    """finalize returns the buffer without the rows of the ids just started."""

    def start_prefetch(self, ids, dp_token_counts=None):
        self._check_ids(ids)
        self.prepare_prefetch()
        self._pending = (ids.shape[0], ids.shape[0], ids.shape[0])


class FinalizeWithoutStart(DeviceResidentEmbedding):
    def finalize(self, out=None):
        if self._pending is None:
            return torch.zeros(1)
        return super().finalize(out)


class AcceptsBadIds(DeviceResidentEmbedding):
    def _check_ids(self, ids):
        pass


class IntCapability(DeviceResidentEmbedding):
    supports_prefetch = 1  # an int, not a bool


class UnknownSideStreamSetting(DeviceResidentEmbedding):
    side_stream_settings = frozenset({"stream_colour"})


class CloseTwiceFails(DeviceResidentEmbedding):
    def close(self):
        if self.weight is None:
            raise RuntimeError("already closed")
        super().close()


class WrongFill(DeviceResidentEmbedding):
    def fill_synthetic(self, seed, scale=None):
        super().fill_synthetic(seed + 1, scale)


class NotTheBase:
    pass


BROKEN = [
    (FlippedByte, "lookup"),
    (IgnoresOut, "local_lookup"),
    (StalePrefetch, "start_prefetch \\+ finalize"),
    (FinalizeWithoutStart, "finalize\\(\\) without start_prefetch"),
    (AcceptsBadIds, "lookup of 1-D ids"),
    (IntCapability, "capability supports_prefetch"),
    (UnknownSideStreamSetting, "stream_colour"),
    (CloseTwiceFails, "second close"),
    (WrongFill, "weight after fill_synthetic"),
    (NotTheBase, "not a subclass"),
]


@pytest.mark.parametrize("cls,message", BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_broken_backends_fail_the_contract(cls, message):
    with pytest.raises(AssertionError, match=message) as info:
        check_backend(cls, dtypes=("bf16",))
    assert isinstance(info.value, ContractError)
    assert cls.__qualname__ in str(info.value)


def test_old_private_hook_names_are_refused():
    for old, new in RENAMED.items():
        with pytest.raises(TypeError, match=new):
            type("Old", (DeviceResidentEmbedding,), {old: lambda self, *a, **k: None})


def test_capabilities_have_defaults_in_the_base():
    for name, kind in CAPABILITIES.items():
        assert isinstance(getattr(PLEEmbedding, name), kind), name
    b = DeviceResidentEmbedding(10, 4, device="cpu")
    assert (b.stats(), b.prefetch_buffer, b.prefetch_stream, b.sm_limit_granted, b.green_via,
            b.prepare_prefetch(), b.warm_cache(None), b.grid_cap) == ({}, None, None, None, None, None, None, None)
    with pytest.raises(NotImplementedError, match="no sm_limit setting"):
        b.set_side_stream_setting("sm_limit", 8)


def test_side_stream_setting_refused_once_the_stream_exists():
    b = PinnedUVAEmbedding(64, 8, device="cpu", max_tokens=2)
    b.set_side_stream_setting("stream_priority", -1)
    assert b.stream_priority == -1
    b._stream = object()  # stands for a side stream made with that priority
    b.set_side_stream_setting("stream_priority", -1)  # same value: nothing to change
    with pytest.raises(ValueError, match="already exists with stream_priority -1"):
        b.set_side_stream_setting("stream_priority", 0)
    b._stream = None


# ------------------------------------------------------------------ grid cap per backend


def _recording_kernel():
    seen: list = []

    @grid_capped
    def kernel(table, flat_ids, out, vocab_start, vocab_end, **options):
        seen.append(options.get("max_programs"))
        torch_masked_lookup(table, flat_ids, out, vocab_start, vocab_end)

    return kernel, seen


def test_grid_cap_reaches_the_kernel_and_is_per_backend():
    kernel, seen = _recording_kernel()
    capped = DeviceResidentEmbedding(100, 8, device="cpu", kernel=kernel)
    other = DeviceResidentEmbedding(100, 8, device="cpu", kernel=kernel)
    for b in (capped, other):
        b.fill_synthetic(3)
    ids = torch.tensor([[5], [99], [0]])
    capped.grid_cap = 2
    rows = capped.lookup(ids)
    other.lookup(ids)
    assert seen == [2, None]
    want = synthetic_rows(ids.reshape(-1), 8, 3, capped.storage_dtype).reshape(3, 8)
    assert torch.equal(rows.view(torch.uint8), want.view(torch.uint8))


def test_grid_cap_needs_a_kernel_that_takes_one():
    b = DeviceResidentEmbedding(100, 8, device="cpu")  # torch_masked on a CPU: no grid cap
    assert not b.supports_grid_cap
    with pytest.raises(ValueError, match="takes no grid cap"):
        b.grid_cap = 4
    b.set_kernel("triton_tuned")
    assert b.supports_grid_cap
    b.grid_cap = 4
    b.set_kernel("torch_masked")  # a kernel without a cap drops it
    assert b.grid_cap is None
    for bad in (0, -1, True, 1.5):
        b.set_kernel("triton_tuned")
        with pytest.raises(ValueError, match="grid_cap"):
            b.grid_cap = bad


def test_grid_capped_kernels_are_the_tuned_ones_and_their_dedup():
    from ple_bench.backends.kernels import get_kernel, kernel_names

    capped = {k for k in kernel_names() if takes_grid_cap(get_kernel(k))}
    assert capped == {"triton_tuned", "dedup:triton_tuned", "dedup_triton"}


def test_dedup_forwards_the_cap_to_its_inner_kernel():
    kernel, seen = _recording_kernel()
    dedup = fast_kernels.make_dedup_kernel(kernel)
    assert takes_grid_cap(dedup)
    b = DeviceResidentEmbedding(50, 4, device="cpu", kernel=dedup)
    b.fill_synthetic(1)
    b.grid_cap = 3
    ids = torch.tensor([[7], [7], [49]])
    rows = b.lookup(ids)
    assert seen == [3]
    want = synthetic_rows(ids.reshape(-1), 4, 1, b.storage_dtype).reshape(3, 4)
    assert torch.equal(rows.view(torch.uint8), want.view(torch.uint8))


def test_tuned_kernel_under_a_grid_cap_is_exact_on_the_cpu():
    b = PinnedUVAEmbedding(300, 16, device="cpu", kernel="triton_tuned", max_tokens=40)
    b.fill_synthetic(9)
    b.grid_cap = 1  # one program loops over every row block
    ids = torch.randint(0, 300, (40, 1))
    want = synthetic_rows(ids.reshape(-1), 16, 9, b.storage_dtype).reshape(40, 16)
    assert torch.equal(b.lookup(ids).view(torch.uint8), want.view(torch.uint8))


def test_engine_grid_frac_sets_the_backends_cap_not_a_global():
    kernel, seen = _recording_kernel()
    b = DeviceResidentEmbedding(100, 8, device="cpu", kernel=kernel)
    b.fill_synthetic(0)
    before = fast_kernels.get_max_programs()
    with executor.case_grid_cap(types.SimpleNamespace(grid_frac=0.5), b):
        assert b.grid_cap == fast_kernels.max_programs_for_grid_frac(0.5, b.device)
        assert fast_kernels.get_max_programs() == before
        b.lookup(torch.tensor([[1]]))
    assert b.grid_cap is None and seen == [fast_kernels.max_programs_for_grid_frac(0.5, b.device)]
    plain = DeviceResidentEmbedding(100, 8, device="cpu")
    with pytest.raises(executor.SkipCase, match="needs a kernel with a grid cap .*triton_tuned"):
        with executor.case_grid_cap(types.SimpleNamespace(grid_frac=0.5), plain):
            pass


# ------------------------------------------------------------------ no private access outside backends/

ALLOWED = {
    # a profiling script that wraps the host path's internal steps one by one, on purpose
    "scripts/gpu/host_gather_profile.py",
    # times the CPU gather's direct path layer by layer (its private steps), on purpose
    "scripts/gpu/host_gather_direct.py",
    # times the native call inside the direct path against the ceiling, interleaved, on purpose
    "scripts/gpu/host_gather_paired.py",
    # calls the direct path's native object with bad arguments, on purpose
    "scripts/gpu/native_errors.py",
    # times the suite's case against the ceiling on the executor's own backend, on purpose
    "scripts/gpu/host_gather_suite_ab.py",
}
# the contract checker reads the declared capabilities by name: that is what it checks
NO_PROBE_RULE = {"ple_bench/testing.py"}
BACKEND_LIKE = {"backend", "b", "emb", "cls", "base", "bd"}


def _backend_private_names() -> set[str]:
    """Single-underscore names the backend classes define: methods and class
    attributes (from the classes) and instance attributes (``self._x = ...`` in
    their source), plus the pre-contract names of the public operations."""
    classes = {get_backend(n) for n in backend_names()} | {PLEEmbedding}
    classes |= {k for c in list(classes) for k in c.__mro__ if isinstance(k, type) and issubclass(k, PLEEmbedding)}
    names = set(RENAMED)
    for cls in classes:
        names |= {n for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
        tree = ast.parse(inspect.getsource(cls))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "self" and isinstance(node.ctx, ast.Store)
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                names.add(node.attr)
    return names


def _receiver_is_backend(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text in BACKEND_LIKE or text.split(".")[-1] in BACKEND_LIKE or "backend" in text.lower()


def violations(source: str, private: set[str], probes: bool = True) -> list[str]:
    """What ``source`` does that only a backend may: ``x._name`` of a backend's
    private name on anything but ``self``; ``getattr``/``hasattr``/``setattr`` of such
    a name; and any ``getattr``/``hasattr`` probe on a backend (a name containing
    "backend", or b / emb / cls / base)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2):
            key = node.args[1]
            named = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if named and key.value in private:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
            elif probes and node.func.id in ("getattr", "hasattr") and _receiver_is_backend(node.args[0]):
                found.append(f"line {node.lineno}: {ast.unparse(node)} (a probe by name)")
    return found


def _engine_files() -> list[Path]:
    files = [p for p in (REPO / "ple_bench").rglob("*.py") if "backends" not in p.relative_to(REPO).parts]
    files += sorted((REPO / "suites").glob("*.py")) + sorted((REPO / "scripts").rglob("*.py"))
    return [p for p in files if str(p.relative_to(REPO)) not in ALLOWED]


def test_the_scanner_finds_planted_violations():
    private = _backend_private_names()
    assert {"_buffer", "_stream", "_pending", "_select", "_check_ids", "_local_lookup"} <= private
    planted = """
class Engine:
    def run(self, backend, case):
        self._buffer = None            # the module's own attribute: fine
        case.sm_limit                  # not a backend: fine
        getattr(case, "sm_limit", 0)   # not a backend: fine
        backend._buffer.fill_(0)
        step.backend._select(1, 2, 3)
        getattr(backend, "_pending", None)
        hasattr(backend, "warm_cache")
        getattr(type(backend), "blocks_host", False)
        b._local_lookup(ids)
"""
    found = violations(planted, private)
    assert sorted(int(f.split(":")[0].split()[1]) for f in found) == [7, 8, 9, 10, 11, 12], found
    assert sorted(int(f.split(":")[0].split()[1]) for f in violations(planted, private, probes=False)) == [7, 8, 9, 12]


def test_no_private_backend_attribute_is_used_outside_backends():
    private = _backend_private_names()
    files = _engine_files()
    assert REPO / "ple_bench" / "run" / "executor.py" in files and REPO / "ple_bench" / "run" / "step.py" in files
    bad = {}
    for p in files:
        rel = str(p.relative_to(REPO))
        found = violations(p.read_text(), private, probes=rel not in NO_PROBE_RULE)
        if found:
            bad[rel] = found
    assert bad == {}, "outside backends/, use the contract of backends/base.py instead:\n" + "\n".join(
        f"{f}: {v}" for f, vs in bad.items() for v in vs)


def test_the_base_module_lists_what_it_declares():
    doc = base_mod.__doc__
    for name in list(CAPABILITIES)[1:] + ["slot_size", "gather_ids", "local_lookup", "reduce_rows",
                                          "prefetch_buffer", "grid_cap", "stats"]:
        assert name in doc, name


def test_only_provenance_writes_meta_json():
    """meta.json has one writer: ple_bench/provenance.py (RunWriter in results.py owns the file).
    Every other module hands what it measured to provenance.add_measured."""
    import ast

    root = Path(__file__).resolve().parent.parent / "ple_bench"
    writers = []
    for path in sorted(root.rglob("*.py")):
        if path.name in ("provenance.py", "results.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("update_meta", "write_meta"):
                writers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not writers, writers
