"""Streams limited to a share of the GPU's SMs, through CUDA green contexts.

:func:`green_stream` returns a ``torch.cuda.Stream`` whose kernels run only on a
green context of about ``num_sms`` SMs (the ``sm_limit`` axis: the prefetch side
stream of the pinned backends), and a :class:`GreenHandle` that keeps the green
context alive and says what the driver granted.  Two ways, tried in order:

1. ``torch``: ``torch.cuda.green_contexts.GreenContext`` when torch was built
   with green contexts and the class offers ``Stream()`` (torch >= 2.12 has it;
   2.10 only has ``set_context``/``pop_context``, which would move *all* of this
   thread's work to the green context: passed over).  ``create`` takes keywords
   (``num_sms=``, ``device_id=``) in new torch and positions in old; both are
   tried.  No stream priority there: a non-zero priority goes to way 2.
2. ``cuda.bindings``: the driver API through the CUDA Python bindings
   (``cuda.bindings.driver``, package ``cuda-bindings``): the device's SM
   resource, split into one group of at least ``num_sms`` SMs
   (``cuDevSmResourceSplitByCount``), a descriptor, a green context and a
   non-blocking stream in it with the requested priority, wrapped as a
   ``torch.cuda.ExternalStream``.  Every ``CUresult`` is checked; a failure
   raises ``RuntimeError`` naming the call and the driver's error name.

The driver rounds the SM count up to its granularity (on Hopper, groups of 8
SMs): ``GreenHandle.granted_sms`` is read back from the resource the context
was made of (torch way: from the stream's green context, when the bindings are
there to ask; else None).  Neither way available, or no CUDA:
:class:`GreenContextUnavailable` (a ``NotImplementedError``: the case is
recorded as skipped with the reason).

Lifetime: a stream that tensors were ``record_stream``-ed on must outlive them
(the caching allocator records an event on it when they are freed), and the
caller's id tensors can outlive a backend.  So the backends take their stream
from :func:`shared_green_stream`: one green context and stream per (device,
SMs, priority), made on first use and kept for the process (a handful per run);
:func:`release_shared` closes them (tests, or a process done with them).
:func:`green_stream` makes a fresh one that its caller owns and closes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ...env import resolve_device


class GreenContextUnavailable(NotImplementedError):
    """No way to limit a stream's SMs here; the message says why."""


# ----------------------------------------------------------------- loaders
def load_driver() -> Any | None:
    """``cuda.bindings.driver``, or None when the package is not installed."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError:
        return None
    return driver


def load_torch_green() -> Any | None:
    """torch's ``GreenContext`` class when it is usable here *and* has ``Stream()``;
    None otherwise (see :func:`torch_green_note` for why)."""
    try:
        from torch.cuda import green_contexts as gc  # newer torch only: absent is a skip
    except ImportError:
        return None
    cls = getattr(gc, "GreenContext", None)
    if cls is None or not getattr(gc, "SUPPORTED", False) or not hasattr(cls, "Stream"):
        return None
    return cls


def torch_green_note() -> str:
    """Why the torch way is passed over (empty when it is usable)."""
    try:
        from torch.cuda import green_contexts as gc  # newer torch only: absent is a skip
    except ImportError:
        return f"torch {torch.__version__} has no torch.cuda.green_contexts"
    cls = getattr(gc, "GreenContext", None)
    if cls is None or not getattr(gc, "SUPPORTED", False):
        return f"torch {torch.__version__} was built without green-context support"
    if not hasattr(cls, "Stream"):
        return (f"torch {torch.__version__}'s GreenContext has no Stream() "
                "(only set_context/pop_context)")
    return ""


# ----------------------------------------------------------------- handle
@dataclass
class GreenHandle:
    """Keeps a green context (and its stream) alive; :meth:`close` releases them.

    ``requested_sms``: what was asked; ``granted_sms``: what the driver gave
    (rounded up to its granularity; None when it could not be read back);
    ``device_sms``: the device's SM count; ``via``: ``"torch"`` or
    ``"cuda.bindings"``; ``notes``: why a way was passed over."""

    requested_sms: int
    granted_sms: int | None
    device_sms: int | None
    via: str
    priority: int = 0
    notes: list[str] = field(default_factory=list)
    _owner: Any = None  # torch GreenContext, or a DriverGreenContext
    _stream: Any = None

    def close(self) -> None:
        """Wait for the stream's work, then release the stream and the context.
        Idempotent.  The stream must not be used afterwards."""
        stream, owner = self._stream, self._owner
        self._stream = self._owner = None
        if stream is not None and owner is not None:
            try:
                stream.synchronize()
            except Exception:  # noqa: BLE001 - e.g. at interpreter exit: nothing left to wait for
                pass
        if isinstance(owner, DriverGreenContext):
            owner.close()
        # a torch GreenContext is released when its last reference goes

    @property
    def closed(self) -> bool:
        return self._owner is None

    def info(self) -> dict[str, Any]:
        return {"sm_limit_granted": self.granted_sms, "green_via": self.via}


# ----------------------------------------------------------------- driver way
def _ok(drv: Any, err: Any) -> bool:
    success = getattr(getattr(drv, "CUresult", None), "CUDA_SUCCESS", 0)
    try:
        return err == success or int(err) == 0
    except (TypeError, ValueError):
        return False


def error_name(drv: Any, err: Any) -> str:
    """The driver's name for ``err`` (``CUDA_ERROR_...``), or its repr."""
    try:
        res = drv.cuGetErrorName(err)
        if isinstance(res, tuple) and len(res) >= 2 and _ok(drv, res[0]):
            name = res[1]
            return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)
    except Exception:  # noqa: BLE001 - a name is a courtesy
        pass
    return str(getattr(err, "name", err))


def _call(drv: Any, name: str, *args: Any) -> Any:
    """``drv.<name>(*args)``; raises naming the call and the error; returns the
    payload (None, one value, or a tuple of them)."""
    result = getattr(drv, name)(*args)
    err, payload = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if not _ok(drv, err):
        raise RuntimeError(f"{name} failed: {error_name(drv, err)} ({int(err) if _is_int(err) else err})")
    if not payload:
        return None
    return payload[0] if len(payload) == 1 else payload


def _is_int(x: Any) -> bool:
    try:
        int(x)
        return True
    except (TypeError, ValueError):
        return False


def _handle_int(handle: Any) -> int:
    return int(handle)


def _sm_count(resource: Any) -> int:
    return int(resource.sm.smCount)


class DriverGreenContext:
    """A green context of at least ``num_sms`` SMs and one stream in it, made
    through ``cuda.bindings.driver`` (``drv``).  ``stream_handle`` (int) is the
    ``CUstream``; ``granted_sms`` the SM count of the resource it was made of;
    ``device_sms`` the device's."""

    def __init__(self, drv: Any, ordinal: int, num_sms: int, priority: int = 0) -> None:
        self.drv = drv
        self.requested_sms = int(num_sms)
        self.priority = int(priority)
        self._gctx: Any = None
        self._stream: Any = None
        self._lock = threading.Lock()
        _call(drv, "cuInit", 0)
        dev = _call(drv, "cuDeviceGet", int(ordinal))
        sm_type = drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
        whole = _call(drv, "cuDeviceGetDevResource", dev, sm_type)
        self.device_sms = _sm_count(whole)
        if num_sms > self.device_sms:
            raise ValueError(f"sm_limit={num_sms}: the device has {self.device_sms} SMs")
        if num_sms == self.device_sms:
            group = whole  # the whole device: nothing to split
        else:
            # one group of >= num_sms SMs (rounded up to the driver's granularity), flags 0
            groups, count, _rest = _call(drv, "cuDevSmResourceSplitByCount", 1, whole, 0, int(num_sms))
            groups = list(groups) if isinstance(groups, (list, tuple)) else [groups]
            if int(count) < 1 or not groups:
                raise ValueError(
                    f"sm_limit={num_sms}: the driver cannot make a group of >= {num_sms} SMs out of "
                    f"{self.device_sms} (SM groups come in multiples of its granularity)"
                )
            group = groups[0]
        self.granted_sms = _sm_count(group)
        desc = _call(drv, "cuDevResourceGenerateDesc", [group], 1)
        flags = drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        self._gctx = _call(drv, "cuGreenCtxCreate", desc, dev, flags)
        try:
            self._stream = _call(drv, "cuGreenCtxStreamCreate", self._gctx,
                                 drv.CUstream_flags.CU_STREAM_NON_BLOCKING, self.priority)
        except BaseException:
            self._destroy_context()
            raise
        self.stream_handle = _handle_int(self._stream)

    def _destroy_context(self) -> None:
        gctx, self._gctx = self._gctx, None
        if gctx is not None:
            try:
                _call(self.drv, "cuGreenCtxDestroy", gctx)
            except Exception:  # noqa: BLE001 - releasing: report nothing, leak at worst
                pass

    def close(self) -> None:
        """Destroy the stream, then the green context (idempotent)."""
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is not None:
                try:
                    _call(self.drv, "cuStreamDestroy", stream)
                except Exception:  # noqa: BLE001
                    pass
            self._destroy_context()

    @property
    def closed(self) -> bool:
        return self._gctx is None


def _granted_of_stream(drv: Any, stream_handle: int) -> int | None:
    """SM count of the green context a stream belongs to (None when unknown)."""
    if drv is None or not hasattr(drv, "cuStreamGetGreenCtx") or not hasattr(drv, "cuGreenCtxGetDevResource"):
        return None
    try:
        handle = drv.CUstream(stream_handle) if hasattr(drv, "CUstream") else stream_handle
        gctx = _call(drv, "cuStreamGetGreenCtx", handle)
        if gctx is None or (_is_int(gctx) and int(gctx) == 0):
            return None
        res = _call(drv, "cuGreenCtxGetDevResource", gctx, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
        return _sm_count(res)
    except Exception:  # noqa: BLE001 - a read-back, not a requirement
        return None


# ----------------------------------------------------------------- torch way
def _torch_create(cls: Any, num_sms: int, index: int) -> Any:
    try:
        return cls.create(num_sms=num_sms, device_id=index)  # torch >= 2.12 (keyword-only)
    except TypeError:
        return cls.create(num_sms, index)  # older: create(num_sms, device_id=0)


# ----------------------------------------------------------------- public
def _device_sm_count(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _external_stream(handle: int, device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.ExternalStream(handle, device=device)


def _ensure_primary_context(device: torch.device) -> None:
    # the driver advises an active primary context before a green context is made
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).synchronize()


def _check_request(device: torch.device | str | int, num_sms: int) -> torch.device:
    """The CUDA device (with its index) after the checks every request gets."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise ValueError(f"sm_limit must be a positive integer number of SMs, got {num_sms!r}")
    device = resolve_device(device)
    if device.type != "cuda":
        raise GreenContextUnavailable(f"sm_limit needs CUDA (green contexts); device is {device}")
    return device


def green_stream(device: torch.device | str | int, num_sms: int,
                 priority: int = 0) -> tuple[torch.cuda.Stream, GreenHandle]:
    """A new stream whose kernels run on a green context of about ``num_sms``
    SMs, and the handle that keeps it alive (the caller closes it; see the
    module docstring).

    ``ValueError`` for ``num_sms`` < 1 or above the device's SM count;
    :class:`GreenContextUnavailable` without CUDA or without a way to make one;
    ``RuntimeError`` (naming the driver's error) when the driver refuses."""
    device = _check_request(device, num_sms)
    total = _device_sm_count(device)
    if num_sms > total:
        raise ValueError(f"sm_limit={num_sms}: the device has {total} SMs")
    _ensure_primary_context(device)
    notes: list[str] = []
    drv = load_driver()

    cls = load_torch_green()
    if cls is None:
        notes.append(torch_green_note())
    elif priority != 0:
        notes.append(f"torch's GreenContext.Stream() takes no priority (asked {priority})")
    else:
        try:
            ctx = _torch_create(cls, num_sms, device.index)
            stream = ctx.Stream()
        except Exception as exc:  # noqa: BLE001 - try the driver way, or say both failed
            if drv is None:
                raise RuntimeError(f"torch GreenContext(num_sms={num_sms}) failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            notes.append(f"torch GreenContext failed: {type(exc).__name__}: {exc}")
        else:
            granted = _granted_of_stream(drv, int(stream.cuda_stream))
            if granted is None:
                notes.append("granted SMs unknown (reading them back needs cuda.bindings)")
            handle = GreenHandle(num_sms, granted, total, "torch", priority, notes, ctx, stream)
            return stream, handle

    if drv is None:
        raise GreenContextUnavailable(
            "no way to limit a stream's SMs here: " + "; ".join(n for n in notes if n)
            + "; and cuda.bindings (package cuda-bindings) is not installed"
        )
    owner = DriverGreenContext(drv, device.index, num_sms, priority)
    try:
        stream = _external_stream(owner.stream_handle, device)
    except BaseException:
        owner.close()
        raise
    handle = GreenHandle(num_sms, owner.granted_sms, owner.device_sms, "cuda.bindings", priority,
                         notes, owner, stream)
    return stream, handle


_SHARED: dict[tuple[int, int, int], tuple[torch.cuda.Stream, GreenHandle]] = {}
_SHARED_LOCK = threading.Lock()


def shared_green_stream(device: torch.device | str | int, num_sms: int,
                        priority: int = 0) -> tuple[torch.cuda.Stream, GreenHandle]:
    """:func:`green_stream`, made once per (device, ``num_sms``, ``priority``) and
    kept for the process (see the module docstring); callers must not close the
    handle (:func:`release_shared` does)."""
    device = _check_request(device, num_sms)
    key = (int(device.index), int(num_sms), int(priority))
    with _SHARED_LOCK:
        made = _SHARED.get(key)
        if made is None or made[1].closed:
            made = _SHARED[key] = green_stream(device, num_sms, priority)
        return made


def release_shared() -> int:
    """Close every shared green context (their streams must be idle and unused
    from now on); returns how many."""
    with _SHARED_LOCK:
        made = list(_SHARED.values())
        _SHARED.clear()
    for _stream, handle in made:
        handle.close()
    return len(made)


__all__ = [
    "shared_green_stream", "release_shared",
    "GreenContextUnavailable", "GreenHandle", "DriverGreenContext", "green_stream", "load_driver",
    "load_torch_green", "torch_green_note", "error_name",
]
