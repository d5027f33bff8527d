"""Native (C++) pieces of the host paths, built on first use with torch's
extension builder and cached per machine (``~/.cache/torch_extensions``, or
``TORCH_EXTENSIONS_DIR``): one build per source, flags, compiler and torch, shared by
every process and checkout (:func:`build_dir`, :func:`_source_in`).

One source, host_gather.cpp: :func:`host_gather_module` gives the module with
``HostGather`` (the CPU gather's direct path) and ``HostGraphGather`` (the host-graph
path's host node, backends/pinned_host_graph.py), or None when it cannot be had -- no
C++ compiler, no ninja, a build error, or ``PLE_BENCH_NATIVE=0`` -- and
:func:`native_status` says which and why.  Without it the same path runs in
Python (slower by the Python around the call: docs/lookup-paths.md)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("host_gather.cpp")
#: -fopenmp: at::parallel_for is a header template, which without it runs its loop on one thread
CFLAGS = ["-O3", "-fopenmp"]

_status: dict[str, str] = {"host_gather": "not built"}


def native_status() -> str:
    """``"native"`` once the module is loaded, else why not (``"not built"`` before the first try)."""
    return _status["host_gather"]


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _module_name(source: bytes | None = None) -> str:
    """The build's name: a hash of everything the build depends on -- the source's bytes, the
    flags, the compiler, the torch and the Python it is built against -- so two checkouts of
    different versions, two environments or two compilers keep one build each, instead of
    rebuilding over each other (or one process loading the other's build)."""
    import torch  # noqa: PLC0415

    key = [source if source is not None else SOURCE.read_bytes(), " ".join(CFLAGS).encode(), _compiler().encode(),
           torch.__version__.encode(), str(Path(torch.__file__).parent).encode(), sys.version.encode()]
    digest = hashlib.sha256(b"\0".join(key)).hexdigest()[:12]
    return f"ple_bench_host_gather_{digest}"


def build_dir(name: str) -> Path:
    """Where the build named ``name`` lives: ``$TORCH_EXTENSIONS_DIR/<name>``, or torch's default
    root (``~/.cache/torch_extensions``)``/<name>``.  Given to torch's builder, so that it does not
    depend on what the builder would pick in each process."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / name


def _source_in(build: Path) -> Path:
    """The source, copied into the build folder (written only when it differs): ninja decides on
    the source's path and mtime, and those of the package's file change with every checkout
    (another worktree, a git checkout rewriting the file) while its bytes -- the build's name --
    do not.  The copy's path and mtime change only with its bytes, so one build serves them all."""
    data = SOURCE.read_bytes()
    build.mkdir(parents=True, exist_ok=True)
    copy = build / SOURCE.name
    if not copy.exists() or copy.read_bytes() != data:
        tmp = copy.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, copy)
    return copy


def _ninja_on_path() -> bool:
    """torch's builder runs ``ninja``; a pip-installed one (the ``ninja`` package, a dependency)
    lives in the environment's bin, which is on PATH only when that environment is activated."""
    if shutil.which("ninja"):
        return True
    try:
        import ninja  # noqa: PLC0415
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") is not None


#: written into the build folder once a build is whole (the build is loaded only then)
BUILT_MARK = "ple_bench.built"
#: our lock on the build folder: an ``flock``, which the OS drops when its owner dies
BUILD_LOCK = "ple_bench.lock"
#: torch's builder's own lock file (``FileBaton``): left behind by a killed builder, every later
#: build waits for it forever
TORCH_LOCK = "lock"


@contextlib.contextmanager
def _build_lock(build: Path):
    """Hold the build folder: one builder at a time, across processes.  Unlike torch's lock file, an
    ``flock`` is released by the OS when its owner dies (a case timeout, a kill), so a killed
    build never blocks the next one; holding it, a torch lock file that is still there is stale."""
    build.mkdir(parents=True, exist_ok=True)
    fd = os.open(build / BUILD_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _drop_stale_lock(build: Path) -> None:
    """Holding :func:`_build_lock`, before a build that has no :data:`BUILT_MARK`: torch's lock file
    is a killed builder's (every builder holds ours first), so it goes.  What the killed build left
    half-written ninja builds again: an output whose command never finished is not in its log."""
    (build / TORCH_LOCK).unlink(missing_ok=True)


def _import_built(name: str, build: Path):
    """The whole build's module, imported from its folder (no builder, no lock: a finished build
    is only read)."""
    spec = importlib.util.spec_from_file_location(name, build / f"{name}.so")
    if spec is None or spec.loader is None:
        raise ImportError(f"no module {name} in {build}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(name: str, build: Path) -> None:
    """Build ``name`` into ``build`` unless a whole build is there: under :func:`_build_lock`,
    from a clean folder, marked whole (:data:`BUILT_MARK`, written atomically) only at the end."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    if (build / BUILT_MARK).exists():
        return
    with _build_lock(build):
        if (build / BUILT_MARK).exists():  # another process built it while this one waited
            return
        _drop_stale_lock(build)
        cpp_extension.load(name=name, sources=[str(_source_in(build))], extra_cflags=CFLAGS,
                           build_directory=str(build), verbose=False)
        tmp = build / f"{BUILT_MARK}.tmp{os.getpid()}"
        tmp.write_text(name + "\n")
        os.replace(tmp, build / BUILT_MARK)


def build_before_cases() -> str:
    """Build the native host gather now, outside any case's timeout (the run calls this before its
    first case that needs it: a first build takes about a minute of one core); returns
    :func:`native_status`."""
    host_gather_module()
    return native_status()


@functools.lru_cache(maxsize=1)
def host_gather_module():
    """The built ``host_gather`` extension, or None (see :func:`native_status`)."""
    if os.environ.get("PLE_BENCH_NATIVE") == "0":
        _status["host_gather"] = "off (PLE_BENCH_NATIVE=0)"
        return None
    if not _ninja_on_path():
        _status["host_gather"] = "no ninja (pip install ninja)"
        return None
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        _status["host_gather"] = "no C++ compiler"
        return None
    t0 = time.perf_counter()
    try:
        name = _module_name()
        build = build_dir(name)
        _build(name, build)
        mod = _import_built(name, build)
    except Exception as e:  # noqa: BLE001 - any build failure leaves the Python path
        _status["host_gather"] = f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
        print(f"ple_bench: the native host gather did not build ({_status['host_gather']}); "
              "pinned_cpu_gather runs its Python direct path", file=sys.stderr)
        return None
    took = time.perf_counter() - t0
    if took > 5:
        print(f"ple_bench: built the native host gather in {took:.0f} s (cached for this machine)", file=sys.stderr)
    _status["host_gather"] = "native"
    return mod


_ERRORS = {"index": IndexError, "value": ValueError}


def native_error(gather) -> Exception:
    """The exception for a ``HostGather`` call that returned its failure value (the module
    returns errors instead of throwing them: host_gather.cpp says why): IndexError for an
    id outside the table, ValueError for a bad argument, RuntimeError for a CUDA error."""
    kind, msg = gather.error()
    return _ERRORS.get(kind, RuntimeError)(msg or "the native host gather failed")


def new_host_gather(*args):
    """``HostGather(*args)`` of the built module (``host_gather_module()`` must not be None),
    raising :func:`native_error` if its arguments were refused."""
    g = host_gather_module().HostGather(*args)
    if g.error()[0]:
        raise native_error(g)
    return g



def new_host_graph_gather(*args):
    """``HostGraphGather(*args)`` of the built module (``host_gather_module()`` must not be
    None), raising :func:`native_error` if its arguments were refused."""
    g = host_gather_module().HostGraphGather(*args)
    if g.error()[0]:
        raise native_error(g)
    return g
