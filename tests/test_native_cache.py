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


def _load(checkout: Path) -> tuple[str, Path]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop("PLE_BENCH_NATIVE", None)
    proc = subprocess.run([sys.executable, "-c", LOAD], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=600)
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
