"""The torch-free facts table (``ple_bench.impl_facts``) says what the backends declare: every
built-in backend class is imported and its declared attributes compared with the table's row, so
the table and the declarations cannot drift apart; and the readers' sets of impls by mechanism
come from the table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.backends.registry import BUILTIN, get_backend
from ple_bench.impl_facts import IMPL_FACTS, MECHANISMS, ImplFacts, facts_of, impls_where

REPO = Path(__file__).resolve().parents[1]


def declared(impl: str) -> ImplFacts:
    cls = get_backend(impl)
    return ImplFacts(lookup_mechanism=cls.lookup_mechanism(), table_in_host_memory=bool(cls.table_in_host_memory),
                     warms_cache=bool(cls.warms_cache))


def test_the_table_names_every_builtin_backend_and_no_other():
    assert set(IMPL_FACTS) == set(BUILTIN)


@pytest.mark.parametrize("impl", sorted(BUILTIN))
def test_each_row_equals_what_the_backend_class_declares(impl):
    assert IMPL_FACTS[impl] == declared(impl)
    assert IMPL_FACTS[impl].lookup_mechanism in MECHANISMS


def test_kernel_free_is_every_path_whose_rows_no_gpu_kernel_moves():
    assert impls_where(kernel_free=True) == {"pinned_cpu_gather", "pinned_copy_engine", "pinned_host_graph",
                                             "pinned_host_flag"}
    assert impls_where(table_in_host_memory=False) == {"device"}
    assert impls_where(warms_cache=True) == {"pinned_hot_cache"}
    assert facts_of("my_pkg.mod:MyBackend") is None and facts_of(None) is None


def test_the_readers_sets_are_read_from_the_table():
    from ple_bench.advise.model import HOST_IMPLS
    from ple_bench.report.data import KERNEL_FREE_IMPLS

    assert KERNEL_FREE_IMPLS == HOST_IMPLS == {impl for impl in BUILTIN if declared(impl).lookup_mechanism != "kernel"}


def test_reading_the_facts_does_not_import_torch():
    probe = "import sys, ple_bench.impl_facts, ple_bench.report.data, ple_bench.advise.model; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("impl", ["pinned_host_graph", "pinned_host_flag", "pinned_cpu_gather", "pinned_copy_engine"])
def test_a_kernel_free_path_is_labelled_by_its_impl_alone(impl):
    """Every path the backends declare kernel-free is labelled without a kernel, even where a record
    names one (the host graph and flag paths were missing from the hand-kept list)."""
    from ple_bench.report.data import path_label

    assert path_label({"impl": impl, "kernel": "triton_reference"}) == impl
    assert path_label({"impl": "pinned_uva", "kernel": "triton_reference"}) == "pinned_uva · triton_reference"


def test_old_records_without_declarations_read_the_impls_facts():
    from ple_bench.advise.model import lookup_kind
    from ple_bench.record import choose_ceiling, device_resident

    assert device_resident({"impl": "device"}) and not device_resident({"impl": "pinned_uva"})
    assert not device_resident({"impl": "my_pkg.mod:Mine"})
    assert choose_ceiling({"impl": "pinned_copy_engine", "gbps": 10.0}, {"h2d_gbps": 50.0})["ceiling"] == "h2d_gbps"
    assert lookup_kind({"impl": "pinned_hot_cache", "table_in_host_memory": True}) == "cached"
    assert lookup_kind({"impl": "pinned_host_flag", "table_in_host_memory": True}) == "host"
    assert lookup_kind({"impl": "pinned_uva", "table_in_host_memory": True}) == "pinned"
