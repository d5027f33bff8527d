"""The ``sm_limit`` axis on a CPU: green-context streams (ple_bench.backends.cuda.green)
through a fake ``cuda.bindings.driver`` (call sequence, arguments, error names,
SM counts read back from the resource, cleanup) and a fake torch GreenContext
(keyword and positional ``create``, ``Stream()``); refusals (no CUDA, no way to
make one, paths whose lookup runs on no SM); the pinned backend's side stream;
suite validation; case ids; a CPU run recording an ``sm_limit`` case as skipped.
The real driver and GPU are checked by tests/gpu/test_green_gpu.py."""

from __future__ import annotations

import enum
import json
import math
import types

import pytest
import torch

from ple_bench.backends.cuda import green
from ple_bench.backends.cuda.green import DriverGreenContext, GreenContextUnavailable, GreenHandle, green_stream
from ple_bench.backends.registry import get_backend
from ple_bench.spec.case import Case

CUDA1 = torch.device("cuda", 1)  # a device *name*: nothing below touches CUDA


# ----------------------------------------------------------------- fakes
class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915


class _Res:
    def __init__(self, sms: int):
        self.sm = types.SimpleNamespace(smCount=sms)


class _Handle:
    def __init__(self, kind: str, value: int):
        self.kind, self.value = kind, value

    def __int__(self) -> int:
        return self.value


class FakeDriver:
    """The parts of ``cuda.bindings.driver`` green.py uses.  SM groups are rounded
    up to ``granularity``; ``fail_at`` makes one call return an error."""

    CUresult = CUresult
    CUdevResourceType = types.SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM="SM")
    CUgreenCtxCreate_flags = types.SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM="DEFAULT_STREAM")
    CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING="NON_BLOCKING")

    def __init__(self, sm_count: int = 132, granularity: int = 8, fail_at: str | None = None,
                 error: CUresult = CUresult.CUDA_ERROR_NOT_SUPPORTED):
        self.sm_count, self.granularity = sm_count, granularity
        self.fail_at, self.error = fail_at, error
        self.calls: list[tuple] = []
        self.live_ctx: set[int] = set()
        self.live_streams: set[int] = set()
        self.stream_ctx: dict[int, int] = {}  # stream handle -> SMs of its green context
        self._next = 0x1000

    def _ret(self, name: str, *payload):
        if self.fail_at == name:
            return (self.error,) + (None,) * len(payload)
        return (CUresult.CUDA_SUCCESS,) + payload

    def _new(self) -> int:
        self._next += 0x10
        return self._next

    def CUstream(self, handle):  # noqa: N802 - the bindings' spelling
        return _Handle("stream", int(handle))

    def cuGetErrorName(self, err):
        return (CUresult.CUDA_SUCCESS, CUresult(err).name.encode())

    def cuInit(self, flags):
        self.calls.append(("cuInit", flags))
        return self._ret("cuInit")

    def cuDeviceGet(self, ordinal):
        self.calls.append(("cuDeviceGet", ordinal))
        return self._ret("cuDeviceGet", _Handle("device", ordinal))

    def cuDeviceGetDevResource(self, dev, kind):
        assert dev.kind == "device" and kind == "SM"
        self.calls.append(("cuDeviceGetDevResource", int(dev), kind))
        return self._ret("cuDeviceGetDevResource", _Res(self.sm_count))

    def cuDevSmResourceSplitByCount(self, groups, resource, flags, min_count):
        self.calls.append(("cuDevSmResourceSplitByCount", groups, resource.sm.smCount, flags, min_count))
        granted = math.ceil(min_count / self.granularity) * self.granularity
        if granted > resource.sm.smCount:
            return self._ret("cuDevSmResourceSplitByCount", [], 0, resource)
        return self._ret("cuDevSmResourceSplitByCount", [_Res(granted)], 1, _Res(resource.sm.smCount - granted))

    def cuDevResourceGenerateDesc(self, resources, count):
        assert count == len(resources) == 1
        self.calls.append(("cuDevResourceGenerateDesc", resources[0].sm.smCount))
        return self._ret("cuDevResourceGenerateDesc", ("desc", resources[0].sm.smCount))

    def cuGreenCtxCreate(self, desc, dev, flags):
        self.calls.append(("cuGreenCtxCreate", desc, int(dev), flags))
        out = self._ret("cuGreenCtxCreate", _Handle("gctx", self._new()))
        if out[0] == 0:
            self.live_ctx.add(int(out[1]))
            self._ctx_sms = desc[1]
        return out

    def cuGreenCtxStreamCreate(self, gctx, flags, priority):
        self.calls.append(("cuGreenCtxStreamCreate", int(gctx), flags, priority))
        out = self._ret("cuGreenCtxStreamCreate", _Handle("stream", self._new()))
        if out[0] == 0:
            self.live_streams.add(int(out[1]))
            self.stream_ctx[int(out[1])] = self._ctx_sms
        return out

    def cuStreamDestroy(self, stream):
        self.calls.append(("cuStreamDestroy", int(stream)))
        self.live_streams.discard(int(stream))
        return self._ret("cuStreamDestroy")

    def cuGreenCtxDestroy(self, gctx):
        self.calls.append(("cuGreenCtxDestroy", int(gctx)))
        self.live_ctx.discard(int(gctx))
        return self._ret("cuGreenCtxDestroy")

    # read-back of a stream's green context (used for torch-made streams)
    def cuStreamGetGreenCtx(self, stream):
        self.calls.append(("cuStreamGetGreenCtx", int(stream)))
        return self._ret("cuStreamGetGreenCtx", _Handle("gctx-of", int(stream)))

    def cuGreenCtxGetDevResource(self, gctx, kind):
        assert kind == "SM"
        return self._ret("cuGreenCtxGetDevResource", _Res(self.stream_ctx[int(gctx)]))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeStream:
    def __init__(self, handle: int, device=None):
        self.cuda_stream, self.device = int(handle), device
        self.synced = 0

    def synchronize(self):
        self.synced += 1


def _no_cuda_calls(monkeypatch, sm_count: int = 132):
    """green_stream's own CUDA touches, replaced: SM count, wrapping, primary context."""
    monkeypatch.setattr(green, "_device_sm_count", lambda device: sm_count)
    monkeypatch.setattr(green, "_external_stream", lambda handle, device: FakeStream(handle, device))
    monkeypatch.setattr(green, "_ensure_primary_context", lambda device: None)


def _use(monkeypatch, driver=None, torch_cls=None):
    monkeypatch.setattr(green, "load_driver", lambda: driver)
    monkeypatch.setattr(green, "load_torch_green", lambda: torch_cls)


DRIVER_SEQUENCE = ["cuInit", "cuDeviceGet", "cuDeviceGetDevResource", "cuDevSmResourceSplitByCount",
                   "cuDevResourceGenerateDesc", "cuGreenCtxCreate", "cuGreenCtxStreamCreate"]


# ----------------------------------------------------------------- driver way
@pytest.mark.parametrize("request_sms,granularity,granted", [(16, 8, 16), (20, 8, 24), (66, 8, 72), (20, 7, 21)])
def test_driver_path_sequence_arguments_and_granted_sms(monkeypatch, request_sms, granularity, granted):
    drv = FakeDriver(granularity=granularity)
    _use(monkeypatch, driver=drv)
    _no_cuda_calls(monkeypatch)
    stream, handle = green_stream(CUDA1, request_sms, priority=-1)
    assert drv.names() == DRIVER_SEQUENCE
    calls = dict((c[0], c[1:]) for c in drv.calls)
    assert calls["cuInit"] == (0,) and calls["cuDeviceGet"] == (1,)
    assert calls["cuDevSmResourceSplitByCount"] == (1, 132, 0, request_sms)  # one group, >= request
    assert calls["cuDevResourceGenerateDesc"] == (granted,)
    assert calls["cuGreenCtxCreate"][1:] == (1, "DEFAULT_STREAM")
    (gctx,) = drv.live_ctx
    assert calls["cuGreenCtxStreamCreate"] == (gctx, "NON_BLOCKING", -1)
    # the torch stream wraps the driver's stream handle, on the asked device
    (sh,) = drv.live_streams
    assert stream.cuda_stream == sh and stream.device == CUDA1
    assert (handle.via, handle.requested_sms, handle.granted_sms, handle.device_sms, handle.priority) == (
        "cuda.bindings", request_sms, granted, 132, -1)
    assert handle.info() == {"sm_limit_granted": granted, "green_via": "cuda.bindings"}
    # close: wait for the stream, destroy the stream, then the context; once
    n = len(drv.calls)
    handle.close()
    assert stream.synced == 1 and drv.names()[n:] == ["cuStreamDestroy", "cuGreenCtxDestroy"]
    assert drv.calls[n] == ("cuStreamDestroy", sh) and drv.calls[n + 1] == ("cuGreenCtxDestroy", gctx)
    assert not drv.live_ctx and not drv.live_streams and handle.closed
    handle.close()
    assert len(drv.calls) == n + 2


@pytest.mark.parametrize("fail_at", DRIVER_SEQUENCE)
def test_driver_errors_name_the_call_and_error_and_leak_nothing(monkeypatch, fail_at):
    drv = FakeDriver(fail_at=fail_at, error=CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
    _use(monkeypatch, driver=drv)
    _no_cuda_calls(monkeypatch)
    with pytest.raises(RuntimeError) as info:
        green_stream(CUDA1, 16)
    msg = str(info.value)
    assert fail_at in msg and "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION" in msg and "915" in msg
    assert drv.names()[-1] == fail_at or drv.names()[-1] == "cuGreenCtxDestroy"
    assert not drv.live_ctx and not drv.live_streams  # a context made before the failure is destroyed
    if fail_at == "cuGreenCtxStreamCreate":
        assert drv.names()[-2:] == ["cuGreenCtxStreamCreate", "cuGreenCtxDestroy"]


def test_whole_device_needs_no_split_and_an_ungroupable_request_is_refused(monkeypatch):
    drv = FakeDriver(sm_count=132, granularity=8)
    _use(monkeypatch, driver=drv)
    _no_cuda_calls(monkeypatch)
    _, handle = green_stream(CUDA1, 132)
    assert handle.granted_sms == 132 and "cuDevSmResourceSplitByCount" not in drv.names()
    handle.close()
    # 130 rounds up to 136 > 132: the driver makes no group
    with pytest.raises(ValueError, match=r"sm_limit=130.*132 SMs|cannot make a group"):
        green_stream(CUDA1, 130)
    assert not drv.live_ctx


def test_bad_requests_are_value_errors_before_any_driver_call(monkeypatch):
    drv = FakeDriver()
    _use(monkeypatch, driver=drv)
    _no_cuda_calls(monkeypatch, sm_count=132)
    for bad in (0, -8, True, 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            green_stream(CUDA1, bad)
    with pytest.raises(ValueError, match="sm_limit=133: the device has 132 SMs"):
        green_stream(CUDA1, 133)
    assert drv.calls == []
    with pytest.raises(ValueError, match="the device has 64 SMs"):
        DriverGreenContext(FakeDriver(sm_count=64), 0, 65)


def test_cpu_and_no_way_are_green_context_unavailable(monkeypatch):
    with pytest.raises(GreenContextUnavailable, match="needs CUDA"):
        green_stream("cpu", 16)
    assert issubclass(GreenContextUnavailable, NotImplementedError)  # -> the case is skipped
    _use(monkeypatch, driver=None, torch_cls=None)
    _no_cuda_calls(monkeypatch)
    with pytest.raises(GreenContextUnavailable, match="cuda-bindings") as info:
        green_stream(CUDA1, 16)
    assert "torch" in str(info.value)  # says why torch's way was passed over too


# ----------------------------------------------------------------- torch way
def _torch_green(drv: FakeDriver | None, positional: bool = False, fail: bool = False):
    made = []

    class GreenContext:
        def __init__(self, num_sms, device_id):
            self.num_sms, self.device_id = num_sms, device_id
            self.handle = 0x7000 + len(made)
            made.append(self)
            if drv is not None:  # the context the driver would report for its stream
                drv.stream_ctx[self.handle] = math.ceil(num_sms / drv.granularity) * drv.granularity

        if positional:
            @staticmethod
            def create(num_sms, device_id=0, /):  # torch <= 2.11 style
                return GreenContext(num_sms, device_id)
        else:
            @staticmethod
            def create(*, num_sms=None, workqueue_scope=None, device_id=None):  # torch >= 2.12 style
                if fail:
                    raise RuntimeError("CUDA driver error: invalid resource configuration")
                return GreenContext(num_sms, device_id)

        def Stream(self):  # noqa: N802
            return FakeStream(self.handle, torch.device("cuda", self.device_id))

    return GreenContext, made


@pytest.mark.parametrize("positional", [False, True])
def test_torch_path_is_preferred_and_granted_is_read_back(monkeypatch, positional):
    drv = FakeDriver(granularity=8)
    cls, made = _torch_green(drv, positional=positional)
    _use(monkeypatch, driver=drv, torch_cls=cls)
    _no_cuda_calls(monkeypatch)
    stream, handle = green_stream(CUDA1, 20)
    assert handle.via == "torch" and len(made) == 1 and (made[0].num_sms, made[0].device_id) == (20, 1)
    assert stream.cuda_stream == made[0].handle and handle.granted_sms == 24
    assert "cuGreenCtxCreate" not in drv.names() and "cuStreamGetGreenCtx" in drv.names()
    handle.close()
    assert stream.synced == 1 and handle.closed


def test_torch_path_without_bindings_or_with_priority(monkeypatch):
    cls, made = _torch_green(None)
    _use(monkeypatch, driver=None, torch_cls=cls)
    _no_cuda_calls(monkeypatch)
    _, handle = green_stream(CUDA1, 16)
    assert handle.via == "torch" and handle.granted_sms is None
    assert any("granted SMs unknown" in n for n in handle.notes)
    # a priority: torch's Stream() takes none -> the driver way
    with pytest.raises(GreenContextUnavailable, match="no priority"):
        green_stream(CUDA1, 16, priority=-1)
    drv = FakeDriver()
    _use(monkeypatch, driver=drv, torch_cls=cls)
    _, handle = green_stream(CUDA1, 16, priority=-1)
    assert handle.via == "cuda.bindings" and len(made) == 1
    assert drv.calls[-1] == ("cuGreenCtxStreamCreate", int(next(iter(drv.live_ctx))), "NON_BLOCKING", -1)
    handle.close()


def test_torch_failure_falls_back_to_the_driver_or_raises(monkeypatch):
    cls, _ = _torch_green(None, fail=True)
    drv = FakeDriver()
    _use(monkeypatch, driver=drv, torch_cls=cls)
    _no_cuda_calls(monkeypatch)
    _, handle = green_stream(CUDA1, 16)
    assert handle.via == "cuda.bindings" and any("torch GreenContext failed" in n for n in handle.notes)
    handle.close()
    _use(monkeypatch, driver=None, torch_cls=cls)
    with pytest.raises(RuntimeError, match="invalid resource configuration"):
        green_stream(CUDA1, 16)


def test_load_torch_green_needs_support_and_stream(monkeypatch):
    import torch.cuda.green_contexts as gc

    class Old:  # torch 2.10: set_context / pop_context only
        @staticmethod
        def create(num_sms, device_id=0):
            raise AssertionError("not to be created")

    class New(Old):
        def Stream(self):  # noqa: N802
            return None

    monkeypatch.setattr(gc, "SUPPORTED", True)
    monkeypatch.setattr(gc, "GreenContext", Old)
    assert green.load_torch_green() is None and "no Stream()" in green.torch_green_note()
    monkeypatch.setattr(gc, "GreenContext", New)
    assert green.load_torch_green() is New and green.torch_green_note() == ""
    monkeypatch.setattr(gc, "SUPPORTED", False)
    assert green.load_torch_green() is None and "without green-context support" in green.torch_green_note()


# ----------------------------------------------------------------- backends
def _pinned(impl: str = "pinned_uva", **kw):
    return get_backend(impl)(512, 16, dtype="fp8", num_heads=2, max_tokens=4, device="cpu", **kw)


def test_pinned_backend_sm_limit_plumbing(monkeypatch):
    b = _pinned(sm_limit=16)
    assert b.sm_limit == 16 and b.sm_limit_granted is None and b.green_via is None
    with pytest.raises(GreenContextUnavailable, match="needs CUDA"):
        b.prepare_prefetch()  # functional mode: no streams to limit
    with pytest.raises(ValueError, match="sm_limit"):
        _pinned(sm_limit=-1)
    assert _pinned().sm_limit == 0 and _pinned("pinned_hot_cache", sm_limit=8).sm_limit == 8
    for impl in ("pinned_cpu_gather", "pinned_copy_engine"):
        with pytest.raises(NotImplementedError, match="no SMs run its lookup"):
            _pinned(impl, sm_limit=16)
        assert _pinned(impl).sm_limit == 0

    # the side stream as made on a GPU: green_stream with the limit and the priority
    from ple_bench.backends import pinned_uva as pinned

    asked, closed = [], []

    class Handle(GreenHandle):
        def close(self):
            closed.append(True)

    def fake_green_stream(device, num_sms, priority=0):
        asked.append((device, num_sms, priority))
        return "the-green-stream", Handle(num_sms, 24, 132, "cuda.bindings", priority)

    monkeypatch.setattr(pinned, "shared_green_stream", fake_green_stream)
    b = _pinned(sm_limit=20, stream_priority=-1)
    assert b._new_side_stream() == "the-green-stream" and asked == [(b.device, 20, -1)]
    assert (b.sm_limit_granted, b.green_via) == (24, "cuda.bindings")
    b.close()
    # the shared context outlives the backend (tensors record_stream-ed on it may too)
    assert closed == [] and b.sm_limit_granted is None and b.prefetch_stream is None


def test_shared_green_streams_are_made_once_per_key_and_released(monkeypatch):
    drv = FakeDriver()
    _use(monkeypatch, driver=drv)
    _no_cuda_calls(monkeypatch)
    monkeypatch.setattr(green, "_SHARED", {})
    s1, h1 = green.shared_green_stream(CUDA1, 16)
    s2, h2 = green.shared_green_stream("cuda:1", 16)
    assert s1 is s2 and h1 is h2 and drv.names().count("cuGreenCtxCreate") == 1
    s3, h3 = green.shared_green_stream(CUDA1, 16, priority=-1)
    s4, _ = green.shared_green_stream(torch.device("cuda", 0), 16)
    assert len({id(s1), id(s3), id(s4)}) == 3 and len(drv.live_ctx) == 3
    with pytest.raises(GreenContextUnavailable):
        green.shared_green_stream("cpu", 16)
    assert green.release_shared() == 3 and not drv.live_ctx and not drv.live_streams
    assert h1.closed and h3.closed
    s5, h5 = green.shared_green_stream(CUDA1, 16)  # made again after a release
    assert h5 is not h1 and len(drv.live_ctx) == 1
    green.release_shared()


# ----------------------------------------------------------------- case, suite, step, executor
def test_case_id_unchanged_without_limit_and_tagged_with_it():
    # ids computed before the axis existed
    assert Case().case_id == "lookup.device.v1048576.d128.bf16.h1.t256-bf21a9e8"
    step = dict(kind="step", impl="pinned_uva", kernel="triton_tuned", prefetch=True, num_tokens=512,
                compute_us=50.0, dtype="fp8", dim=160, num_heads=16, stream_priority=-1)
    old = "step.pinned_uva.triton_tuned.v1048576.d160.fp8.h16.t512.pf.c50us.prio-1-2c5683c7"
    assert Case(**step).case_id == Case(**step, sm_limit=0).case_id == old
    cid = Case(**step, sm_limit=16).case_id
    assert ".prio-1.sm16-" in cid and cid != old and ".prio-1.sm66-" in Case(**step, sm_limit=66).case_id
    assert Case.from_axes(Case(**step, sm_limit=16).axes()).case_id == cid


SUITE = """
[suite]
description = "sm limit"
[defaults]
kind = "{kind}"
impl = "pinned_uva"
vocab_size = 512
dim = 16
num_heads = 2
num_tokens = 4
hidden = 16
compute_us = 0
[[group]]
prefetch = {prefetch}
sm_limit = {sm_limit}
"""


def _suite(tmp_path, kind="step", prefetch="true", sm_limit="[0, 16]"):
    p = tmp_path / "sm.toml"
    p.write_text(SUITE.format(kind=kind, prefetch=prefetch, sm_limit=sm_limit))
    return p


def test_suite_validates_sm_limit(tmp_path):
    from ple_bench.spec.suite import SuiteError, load_suite

    s = load_suite(_suite(tmp_path))
    assert sorted(c.sm_limit for c in s.cases if c.impl != "device") == [0, 16]  # + the resident baselines
    assert sum("sm16" in c.case_id for c in s.cases) == 1
    assert load_suite(_suite(tmp_path, kind="lookup")).cases[1].sm_limit == 16  # lookups with prefetch: allowed
    for bad, words in (("-1", ["key 'sm_limit'", ">= 0"]), ('"16"', ["key 'sm_limit'", "not an integer"]),
                       ("2.5", ["key 'sm_limit'", "not an integer"])):
        with pytest.raises(SuiteError) as info:
            load_suite(_suite(tmp_path, sm_limit=bad))
        assert all(w in str(info.value) for w in words), str(info.value)
    with pytest.raises(SuiteError) as info:
        load_suite(_suite(tmp_path, prefetch="false"))
    assert "key 'sm_limit'" in str(info.value) and "prefetch = true" in str(info.value)
    ok = _suite(tmp_path, prefetch='["on", "off"]')
    ok.write_text(ok.read_text() + 'exclude = [{prefetch = "off", sm_limit = 16}]\n')
    assert len([c for c in load_suite(ok).cases if c.impl != "device"]) == 3


def test_overlap_suite_has_the_sm_limit_group():
    from ple_bench.spec.suite import load_suite

    s = load_suite("overlap")
    (group,) = [g for g in s.groups if g.name == "SM limit (green contexts)"]
    by_id = {c.case_id: c for c in s.cases}
    limited = [c for c in s.cases if c.sm_limit]
    assert {c.sm_limit for c in limited} == {16, 66} and len(limited) == 32
    assert {c.ids_on for c in limited} == {"host", "device"}  # each with ids on the host and on the device
    assert all(c.prefetch and c.impl == "pinned_uva" and c.kernel in ("triton_reference", "triton_tuned")
               and c.num_tokens in (256, 512) and c.compute_us in (50.0, 200.0) for c in limited)
    assert all(by_id[i].sm_limit in (0, 16, 66) for i in group.case_ids)


def test_step_refuses_sm_limit_where_it_cannot_apply():
    from ple_bench.run.step import _apply_sm_limit, run_step_case
    from tests.test_step import _case, _tiny_policy, make_backend, make_ids

    backend = make_backend("pinned_uva")
    with pytest.raises(NotImplementedError, match="sm_limit=16 needs CUDA"):
        run_step_case(_case("pinned_uva", prefetch=True, sm_limit=16), backend, make_ids(1)[0], None,
                      _tiny_policy(), "cpu")
    cuda = torch.device("cuda", 0)  # only compared, never used
    case = types.SimpleNamespace(impl="pinned_uva", prefetch=False)
    with pytest.raises(NotImplementedError, match="launches no side stream"):
        _apply_sm_limit(backend, 16, case, cuda)
    case.prefetch = True
    with pytest.raises(NotImplementedError, match="no SMs run its lookup"):
        _apply_sm_limit(_pinned("pinned_cpu_gather"), 16, case, cuda)
    _apply_sm_limit(backend, 16, case, cuda)
    assert backend.sm_limit == 16  # set before its side stream exists
    backend._stream = object()  # as if the side stream had been made
    with pytest.raises(ValueError, match="already exists with sm_limit 16"):
        _apply_sm_limit(backend, 32, case, cuda)


def test_executor_skips_on_cpu_and_never_reuses_a_table_across_limits():
    from ple_bench.run.executor import CaseExecutor
    from ple_bench.run.outcome import SkipCase
    from ple_bench.parallel import Groups, Topology
    from tests.test_step import _tiny_policy

    ex = CaseExecutor()
    base = dict(kind="step", impl="pinned_uva", vocab_size=512, dim=16, dtype="fp8", num_heads=2,
                num_tokens=4, hidden=16, compute_us=0.0, prefetch=True)
    topo, groups = Topology(), Groups.single()
    b0 = ex.backend_for(Case(**base), topo, groups)
    b16 = ex.backend_for(Case(**base, sm_limit=16), topo, groups)
    assert b16 is not b0 and (b0.sm_limit, b16.sm_limit) == (0, 16)
    assert ex.backend_for(Case(**base, sm_limit=16), topo, groups) is b16
    with pytest.raises(SkipCase, match="sm_limit=16 needs CUDA"):
        ex.run(Case(**base, sm_limit=16), _tiny_policy())
    with pytest.raises(SkipCase, match="no SMs run its lookup"):
        ex.run(Case(**dict(base, impl="pinned_copy_engine"), sm_limit=16), _tiny_policy())
    with pytest.raises(SkipCase, match="does not accept"):
        ex.run(Case(**dict(base, impl="device", prefetch=False), sm_limit=16), _tiny_policy())
    ex.release_table()


@pytest.mark.slow
def test_cpu_run_records_sm_limit_case_skipped(tmp_path):
    from ple_bench import results
    from tests.test_cli import _only_run, cli

    suite = _suite(tmp_path)
    suite.write_text(suite.read_text().replace("[defaults]", "[suite.timing]\nwarmup_ms = 0\nmin_samples = 3\n"
                                               "max_samples = 4\nmax_time_s = 0.2\n[defaults]"))
    proc = cli("run", "--suite", str(suite), "--results-dir", str(tmp_path / "res"), "--no-report")
    recs = {r["sm_limit"]: r for r in results.load_records(_only_run(tmp_path / "res"))}
    assert set(recs) == {0, 16}, proc.stderr[-2000:]
    assert recs[0]["status"] == "ok" and "sm16" not in recs[0]["case_id"], json.dumps(recs[0])[:2000]
    assert recs[16]["status"] == "skipped" and "sm16" in recs[16]["case_id"]
    assert "sm_limit=16 needs CUDA" in recs[16]["reason"] and recs[16]["median_ms"] is None


def test_report_shows_the_limit_and_what_was_granted(tmp_path):
    from ple_bench.report.data import Run
    from ple_bench.report.html import record_columns, step_table
    from ple_bench.report.sections import PATH_AXES, WORKLOAD_AXES, step_config_axes, step_config_label

    def rec(sm, granted, exposed):
        c = Case(kind="step", impl="pinned_uva", kernel="triton_tuned", dtype="fp8", dim=160, num_heads=16,
                 num_tokens=256, prefetch=True, compute_us=50.0, sm_limit=sm)
        r = dict(c.axes(), case_id=c.case_id, status="ok", step_ms=0.30 + exposed, lookup_ms=0.2,
                 compute_ms=0.30, exposed_ms=exposed, compute_slowdown=0.1, overlap_efficiency=0.5,
                 world_size=1, median_ms=0.30 + exposed)
        if sm:
            r.update(sm_limit_granted=granted, green_via="cuda.bindings")
        return r

    recs = [rec(0, None, 0.05), rec(16, 16, 0.09), rec(66, 72, 0.06)]
    keys = [c.key for c in record_columns(recs)]
    assert keys.index("sm_limit_granted") == keys.index("sm_limit") + 1
    assert keys.index("sm_limit") == keys.index("grid_frac") + 1 or "grid_frac" not in keys
    assert "sm_limit" in PATH_AXES and "sm_limit" not in WORKLOAD_AXES
    axes = step_config_axes(recs)
    assert "sm_limit" in axes
    labels = [step_config_label(r, axes) for r in recs]
    assert labels[0].endswith("all SMs") and labels[1].endswith("16 SMs") and labels[2].endswith("66 SMs")
    cols, rows, _ = step_table(Run(path=tmp_path, meta={}, records=recs))
    keys = [c.key for c in cols]
    assert "sm_limit" in keys and "sm_limit_granted" in keys
    granted = [row["cells"][keys.index("sm_limit_granted")]["text"] for row in rows]
    assert sorted(granted) == ["", "16", "72"]
