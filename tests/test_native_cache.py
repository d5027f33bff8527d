"""The native host gather is built once per machine: a second process -- here from another
checkout, whose copy of the source is newer than the build -- loads the build, compiling nothing.

The test uses the machine's own build (``TORCH_EXTENSIONS_DIR`` or torch's default root, which the
other native tests load too; built here if it is missing) rather than a fresh cache of its own: a
build costs about a minute of one core, and the check is the same -- the second checkout's process
must find that build and run no compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOAD = ("from ple_bench.backends.cuda.native import build_dir, _module_name, host_gather_module, native_status; "
        "host_gather_module(); print(native_status()); print(build_dir(_module_name()))")


def _load(checkout: Path, timeout: float = 600) -> tuple[str, Path]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop("PLE_BENCH_NATIVE", None)
    proc = subprocess.run([sys.executable, "-c", LOAD], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, build = proc.stdout.split("\n")[:2]
    if status != "native":
        pytest.skip(f"the native host gather does not build here: {status}")
    return proc.stderr, Path(build)


def test_the_names_of_two_sources_differ_and_of_one_source_agree():
    from ple_bench.backends.cuda.native import SOURCE, _module_name

    data = SOURCE.read_bytes()
    assert _module_name(data) == _module_name() and _module_name(data + b"\n") != _module_name()


@pytest.mark.slow
def test_a_second_process_from_another_checkout_reuses_the_build(tmp_path):
    _, build = _load(ROOT)
    built = {p.name: p.stat().st_mtime_ns for p in build.iterdir() if p.suffix in (".o", ".so")}
    log = (build / ".ninja_log").read_text()
    assert any(name.endswith(".o") for name in built) and any(name.endswith(".so") for name in built)
    other = tmp_path / "other"  # a second checkout: same bytes, another path, a newer file
    shutil.copytree(ROOT / "ple_bench", other / "ple_bench", ignore=shutil.ignore_patterns("__pycache__"))
    err, again = _load(other)
    assert again == build
    assert {p.name: p.stat().st_mtime_ns for p in build.iterdir() if p.suffix in (".o", ".so")} == built
    assert (build / ".ninja_log").read_text() == log  # ninja ran no command
    assert "built the native host gather" not in err


def test_a_lock_left_by_a_killed_build_is_recognised_and_a_build_is_marked_whole_only_at_its_end(tmp_path,
                                                                                                  monkeypatch):
    """torch's builder waits forever on its ``lock`` file while it exists; a build killed by a case
    timeout left one behind, and every later host-gather case then hung until its own timeout."""
    from torch.utils import cpp_extension

    from ple_bench.backends.cuda import native

    build = tmp_path / "ext"
    build.mkdir()
    (build / native.TORCH_LOCK).write_text("")  # the killed builder's
    calls = []

    def killed(**kw):
        calls.append(kw["name"])
        raise KeyboardInterrupt  # the build dies midway

    monkeypatch.setattr(cpp_extension, "load", killed)
    with pytest.raises(KeyboardInterrupt):
        native._build("m", build)
    assert calls == ["m"] and not (build / native.TORCH_LOCK).exists()  # not waited on: removed
    assert not (build / native.BUILT_MARK).exists()  # a build that did not finish is not whole

    def finishes(**kw):
        assert not (build / native.TORCH_LOCK).exists()
        calls.append(kw["name"])

    (build / native.TORCH_LOCK).write_text("")
    monkeypatch.setattr(cpp_extension, "load", finishes)
    native._build("m", build)
    native._build("m", build)  # whole: no builder runs again
    assert calls == ["m", "m"] and (build / native.BUILT_MARK).exists()


@pytest.mark.slow
def test_a_stale_torch_lock_does_not_hang_the_next_load():
    _, build = _load(ROOT)
    from ple_bench.backends.cuda import native

    (build / native.BUILT_MARK).unlink(missing_ok=True)
    (build / native.TORCH_LOCK).write_text("")  # as a build killed by a case timeout leaves it
    _, again = _load(ROOT, timeout=240)  # torch's builder alone waits on it forever
    assert again == build and not (build / native.TORCH_LOCK).exists()
    assert (build / native.BUILT_MARK).exists()


def test_a_run_builds_the_native_gather_before_its_first_case_not_inside_a_case_timeout(monkeypatch):
    from ple_bench.backends.cuda import native
    from ple_bench.run import dispatch
    from ple_bench.spec.suite import load_suite

    built = []
    monkeypatch.setattr(native, "build_before_cases", lambda: built.append(1) or "native")
    cases = load_suite("smoke").cases
    device = [c for c in cases if c.impl == "device"]
    dispatch.build_native_first(device, "functional", None, True)
    assert built == []  # no host-gather path, no GPU ceiling: nothing to build
    dispatch.build_native_first(device + [c for c in cases if c.impl == "pinned_cpu_gather"], "functional", None, True)
    assert built == [1]
