"""What each built-in lookup path declares about itself, readable without torch.

The backends declare these facts as class attributes (``ple_bench/backends/*.py``:
``lookup_mechanism()`` from ``gathers_on_host`` / ``reads_ids_on_host``, ``table_in_host_memory``,
``warms_cache``), and a run writes the first two into each record.  Readers of stored records
(report, advise) must not import torch, and ``ple_bench.backends`` does; they read the facts of an
``impl`` here instead -- for records that predate the declared fields, and for what a record does
not carry.  ``tests/test_impl_facts.py`` imports every built-in backend and checks this table
equals what each class declares, so the two cannot drift: a new backend, or a changed
declaration, fails that test until the table says the same.
"""

from __future__ import annotations

from dataclasses import dataclass

#: how a path moves its rows (``PLEEmbedding.lookup_mechanism``)
MECHANISMS = ("kernel", "host_gather", "host_copy")


@dataclass(frozen=True)
class ImplFacts:
    """One built-in path's declared facts."""

    #: ``kernel`` (a GPU lookup kernel reads the table), ``host_gather`` (the host's cores gather)
    #: or ``host_copy`` (copy engines move the rows, ids read on the host)
    lookup_mechanism: str
    #: the table lives in host memory (pinned where there is a GPU)
    table_in_host_memory: bool
    #: a hot-row cache in HBM, warmed from a sample of the traffic, serves part of the rows
    warms_cache: bool = False

    @property
    def kernel_free(self) -> bool:
        """No GPU gather kernel of its own: host cores or copy engines move the rows (the kernel
        axis does not apply)."""
        return self.lookup_mechanism != "kernel"


#: every built-in ``impl`` (``ple_bench.backends.registry.BUILTIN``) -> its declared facts
IMPL_FACTS: dict[str, ImplFacts] = {
    "device": ImplFacts("kernel", table_in_host_memory=False),
    "pinned_uva": ImplFacts("kernel", table_in_host_memory=True),
    "pinned_cpu_gather": ImplFacts("host_gather", table_in_host_memory=True),
    "pinned_hot_cache": ImplFacts("kernel", table_in_host_memory=True, warms_cache=True),
    "pinned_copy_engine": ImplFacts("host_copy", table_in_host_memory=True),
    "pinned_host_graph": ImplFacts("host_gather", table_in_host_memory=True),
    "pinned_host_flag": ImplFacts("host_gather", table_in_host_memory=True),
}


def facts_of(impl: object) -> ImplFacts | None:
    """The declared facts of a built-in ``impl``; None for any other name (a user's backend)."""
    return IMPL_FACTS.get(str(impl)) if impl is not None else None


def impls_where(**facts: object) -> frozenset[str]:
    """The built-in impls whose facts have every given value (``impls_where(kernel_free=True)``)."""
    return frozenset(impl for impl, f in IMPL_FACTS.items()
                     if all(getattr(f, name) == value for name, value in facts.items()))
