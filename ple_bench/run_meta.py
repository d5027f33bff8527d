"""The run's ``meta.json`` as one typed object: :class:`RunMeta`.

``run.provenance`` makes it, changes it and writes it (``start_meta``, ``note``, ``add_measured``,
``keep_case_ceilings``, ``finish_meta``: the only writers, through the few methods below); the
readers (``report``, ``advise``) load it (:meth:`RunMeta.load`, :func:`as_meta`) and read typed
properties: the run's words (``suite``, ``mode``, ``status``...), ``num_cases``, the ``device``
(:class:`Device`) and the ``ceilings`` (:class:`Ceilings`: the machine-wide figures and the per-case
``host_gather`` / ``random_row`` entries, :class:`CaseCeiling`).  Numbers are read once, when the
typed view is made (:func:`ple_bench.record.num`: finite floats, else None), as a record's are.

It is a read-only mapping of the stored JSON too (``meta.get("argv")``, ``dict(meta)``), so a
reader of a key that has no property, and the storage (:mod:`ple_bench.results`), see the file as
written: the format of ``meta.json`` is the dict :meth:`RunMeta.to_json` returns, unchanged.
Torch-free (the report and advise read it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from .record import num
from .results import load_meta


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    f = num(value)
    return None if f is None else int(f)


@dataclass(frozen=True)
class CaseCeiling:
    """One per-case ceiling (``ceilings["host_gather"][key]`` or ``ceilings["random_row"][key]``),
    its numbers read at load (None where absent or not a finite number); ``raw``: the entry as
    stored."""

    key: str
    raw: Mapping[str, Any] = field(repr=False)
    table_bytes: float | None = None
    rows: float | None = None
    row_bytes: float | None = None
    ms: float | None = None
    threads: float | None = None
    #: the id distribution, memory (device | pinned), order and host allocation, as stored (None: not stored)
    ids: str | None = None
    memory: str | None = None
    order: str | None = None
    host_alloc: str | None = None

    @classmethod
    def of(cls, key: Any, raw: Mapping[str, Any]) -> "CaseCeiling":
        return cls(key=str(key), raw=raw, table_bytes=num(raw.get("table_bytes")), rows=num(raw.get("rows")),
                   row_bytes=num(raw.get("row_bytes")), ms=num(raw.get("ms")), threads=num(raw.get("threads")),
                   ids=_text(raw.get("ids")) if raw.get("ids") else None,
                   memory=_text(raw.get("memory")), order=_text(raw.get("order")) if raw.get("order") else None,
                   host_alloc=_text(raw.get("host_alloc")) if raw.get("host_alloc") else None)

    @property
    def timed(self) -> bool:
        """A time and a row count, both non-zero (what a per-row rate is made of)."""
        return bool(self.ms) and bool(self.rows)


class Ceilings:
    """``meta.json``'s ``ceilings``: the machine-wide figures (GB/s, rows/s, how they were timed)
    by name, and the per-case families (``host_gather``, ``random_row``: objects of objects)."""

    def __init__(self, raw: Any) -> None:
        #: as stored ({} where the run has none)
        self.raw: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        #: every entry that is no family (not an object), its number read (None: not a finite number)
        self.figures: dict[str, float | None] = {str(k): num(v) for k, v in self.raw.items() if not isinstance(v, dict)}
        self.host_gather: tuple[CaseCeiling, ...] = self._family("host_gather")
        self.random_row: tuple[CaseCeiling, ...] = self._family("random_row")

    def _family(self, name: str) -> tuple[CaseCeiling, ...]:
        entries = self.raw.get(name)
        if not isinstance(entries, dict):
            return ()
        return tuple(CaseCeiling.of(k, v) for k, v in entries.items() if isinstance(v, dict))

    def figure(self, name: str) -> float | None:
        """The figure ``name`` (a finite number), or None."""
        return self.figures.get(name)

    def positive(self, name: str) -> float | None:
        """The figure ``name`` where it is a positive number, else None."""
        v = self.figures.get(name)
        return v if v is not None and v > 0 else None

    @property
    def gbps(self) -> dict[str, float]:
        """The bandwidth ceilings (GB/s): the positive figures whose name says ``gbps``."""
        return {k: v for k, v in self.figures.items() if "gbps" in k and v is not None and v > 0}

    def starting(self, prefix: str) -> list[float | None]:
        """The figures whose name starts with ``prefix`` (``allreduce_busbw``: one per world size)."""
        return [v for k, v in self.figures.items() if k.startswith(prefix)]

    @property
    def h2d_gbps(self) -> float | None:
        return self.figure("h2d_gbps")

    @property
    def d2d_gbps(self) -> float | None:
        return self.figure("d2d_gbps")

    @property
    def hbm_read_gbps(self) -> float | None:
        return self.figure("hbm_read_gbps")

    @property
    def pinned_random_row_rows_per_s(self) -> float | None:
        return self.figure("pinned_random_row_rows_per_s")


@dataclass(frozen=True)
class Device:
    """``meta.json``'s ``device`` (the GPU of rank 0 and its host), numbers read at load; ``raw``:
    as stored (an old run may store the name alone, as text)."""

    raw: Mapping[str, Any] = field(repr=False)
    name: str | None = None
    memory_bytes: float | None = None
    host_memory_bytes: float | None = None
    sm_count: float | None = None

    @classmethod
    def of(cls, raw: Any) -> "Device | None":
        """The device stored, or None where none is (nothing, or an empty object)."""
        if not raw:
            return None
        if isinstance(raw, dict):
            return cls(raw=raw, name=_text(raw.get("name")) if raw.get("name") else None,
                       memory_bytes=num(raw.get("memory_bytes")), host_memory_bytes=num(raw.get("host_memory_bytes")),
                       sm_count=num(raw.get("sm_count")))
        return cls(raw={"name": raw}, name=str(raw))


class RunMeta(Mapping[str, Any]):
    """A run's ``meta.json``: typed properties for what readers use, and a read-only mapping of
    the stored JSON.  Only :mod:`ple_bench.run.provenance` changes it (:meth:`update`,
    :meth:`merge_ceilings`, :meth:`keep_device`, :meth:`add_case_ceiling`)."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunMeta":
        """``run_dir/meta.json`` (:func:`ple_bench.results.load_meta`: its errors)."""
        return cls(load_meta(run_dir))

    # ---------------------------------------------------------------- the stored JSON
    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"RunMeta({self._data!r})"

    def to_json(self) -> dict[str, Any]:
        """The dict ``meta.json`` holds (the object itself, not a copy: write it, do not change it)."""
        return self._data

    # ---------------------------------------------------------------- typed reads
    def _word(self, key: str) -> str | None:
        v = self._data.get(key)
        return str(v) if v not in (None, "") else None

    @property
    def run_id(self) -> str | None:
        return self._word("run_id")

    @property
    def suite(self) -> str | None:
        return self._word("suite")

    @property
    def mode(self) -> str | None:
        """gpu | functional, as the run says (None: it does not)."""
        return self._word("mode")

    @property
    def timer(self) -> str | None:
        return self._word("timer")

    @property
    def status(self) -> str | None:
        """running | complete | interrupted | aborted (None: not stored)."""
        return self._word("status")

    @property
    def started_at(self) -> str | None:
        return self._word("started_at")

    @property
    def ended_at(self) -> str | None:
        return self._word("ended_at")

    @property
    def git_commit(self) -> str | None:
        return self._word("git_commit")

    @property
    def num_cases(self) -> int | None:
        """How many cases the run set out to record (None: not stored)."""
        return _int(self._data.get("num_cases"))

    @property
    def compute_profile(self) -> dict[str, Any]:
        """Where the run's compute profile came from (``source``, ``added``...); {} where not said."""
        v = self._data.get("compute_profile")
        return dict(v) if isinstance(v, dict) else {}

    @property
    def repeated(self) -> dict[str, Any]:
        """The cases the run repeats in fresh processes, case id -> how ({} where none)."""
        v = self._data.get("repeated")
        return dict(v) if isinstance(v, dict) else {}

    @functools.cached_property
    def ceilings(self) -> Ceilings:
        return Ceilings(self._data.get("ceilings"))

    @functools.cached_property
    def device(self) -> Device | None:
        return Device.of(self._data.get("device"))

    # ---------------------------------------------------------------- changes (provenance's)
    def _changed(self) -> None:
        for name in ("ceilings", "device"):
            self.__dict__.pop(name, None)

    def update(self, **fields: Any) -> None:
        """Set top-level entries."""
        self._data.update(fields)
        self._changed()

    def merge_ceilings(self, found: Mapping[str, Any]) -> dict[str, Any]:
        """``found`` merged over the ceilings known (a copy, entry by entry); returns them."""
        merged = dict(self._data.get("ceilings") or {})
        merged.update(found)
        self.update(ceilings=merged)
        return merged

    def keep_device(self, device: Any) -> bool:
        """The device, where none is known yet; whether it was kept."""
        if not device or self._data.get("device"):
            return False
        self.update(device=device)
        return True

    def add_case_ceiling(self, family: str, key: str, value: Any) -> bool:
        """A per-case ceiling (``ceilings[family][key]``), once per key; whether it was new."""
        ceilings = self._data.setdefault("ceilings", {}) or {}
        self._data["ceilings"] = ceilings
        table = ceilings.setdefault(family, {})
        if key in table:
            return False
        table[key] = value
        self._changed()
        return True


def as_meta(meta: Mapping[str, Any] | None) -> RunMeta:
    """``meta`` as a :class:`RunMeta` (itself when it is one; {} for None)."""
    return meta if isinstance(meta, RunMeta) else RunMeta(meta)
