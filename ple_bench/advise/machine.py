"""The machine a prediction is for, and the per-row rates the runs' own ceilings give.

:class:`Machine` -- HBM bytes, HBM read GB/s, H2D GB/s, the host-gather row rate and the host cores
it was measured with, the SM count -- read from the runs' ``meta.json`` (``device`` and
``ceilings``) by default, each figure overridable (``advise --machine FILE``, TOML or JSON with
these keys, and flags); every figure says whether it was *measured* (and from what) or *given*.
The model (:mod:`ple_bench.advise.model`) scales its rate terms by a target machine's figures over
the measured ones (:meth:`Machine.factors`).

:class:`CeilingRates` -- the time one row costs at a table size and row size, from the runs'
per-case ceilings (``ceilings["random_row"]``: ``torch.index_select`` of the case's own ids from
its own table, device or pinned, random or sorted order; ``ceilings["host_gather"]``: a host
gather into pinned staging plus its host->device copy).  For each (table, row size) measured it
takes the per-row slope of the ceiling's time over its row counts (what one more row costs once
the batch hides latency); between measured table sizes it interpolates in log-log; past them it
keeps the last segment's slope (never falling); at another row size it takes
``max(latency-bound time at the table, max(row_bytes, SECTOR_BYTES) / link)``: a random row costs
at least one sector, and at least its bytes over the link.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..run_meta import CaseCeiling, as_meta
from ..units import tomllib

#: a random row read moves at least one 64-byte sector pair from DRAM (and one PCIe read request):
#: below it, a row costs what a 64-byte row does
SECTOR_BYTES = 64
#: a GPU kernel's random-row rate grows with its SMs up to about this many, then is bound by the link's
#: outstanding requests (an assumption, checked against green-context runs in docs/advise.md): fewer SMs
#: than this slow a kernel path's rate terms by SM_SATURATION / sms
SM_SATURATION = 32
#: the row count the per-row slope of a ceiling is quoted at when only one row count was measured
_MIN_SLOPE_ROWS = 2


class MachineError(ValueError):
    """A machine description that cannot be read (exit 2, naming the key or the file)."""


@dataclass
class Machine:
    """What a prediction depends on in the machine.  None: not known (not measured, not given)."""

    hbm_bytes: int | None = None
    hbm_read_gbps: float | None = None
    h2d_gbps: float | None = None
    host_gather_rows_per_s: float | None = None  # the host gather's row rate at its measured threads
    host_cores: int | None = None  # the threads the host gather ran on
    sms: int | None = None
    #: per figure: "measured: <where>" or "given: <where>"
    sources: dict[str, str] = field(default_factory=dict)

    KEYS = ("hbm_bytes", "hbm_read_gbps", "h2d_gbps", "host_gather_rows_per_s", "host_cores", "sms")

    def given(self, source: str, **values: Any) -> "Machine":
        """A copy with ``values`` (None ones ignored) set and marked given by ``source``."""
        out = Machine(**{k: getattr(self, k) for k in self.KEYS}, sources=dict(self.sources))
        for k, v in values.items():
            if k not in self.KEYS:
                raise MachineError(f"{source}: unknown machine key {k!r}; allowed: {', '.join(self.KEYS)}")
            if v is None:
                continue
            try:
                v = int(v) if k in ("hbm_bytes", "host_cores", "sms") else float(v)
            except (TypeError, ValueError):
                raise MachineError(f"{source}: {k} must be a number, got {v!r}") from None
            if v <= 0:
                raise MachineError(f"{source}: {k} must be positive, got {v}")
            setattr(out, k, v)
            out.sources[k] = f"given: {source}"
        return out

    def factors(self, target: "Machine | None") -> dict[str, float]:
        """How much longer each rate term takes on ``target`` than on this (the measured) machine:
        ``pinned`` (a GPU kernel reading pinned host memory: the H2D link, and the SMs issuing its
        reads), ``device`` (a kernel reading HBM), ``copy`` (rows copied host to device),
        ``gather`` (rows gathered by host cores: the host-gather rate; the thread count is the
        model's thread fit, not here).  1 where either side does not know the figure."""
        def ratio(name: str) -> float:
            mine, theirs = getattr(self, name), getattr(target, name) if target else None
            return mine / theirs if mine and theirs else 1.0
        sms = 1.0
        if self.sms and target is not None and target.sms:
            sms = min(self.sms, SM_SATURATION) / target.sms
        return {"pinned": ratio("h2d_gbps") * max(1.0, sms), "device": ratio("hbm_read_gbps") * max(1.0, sms),
                "copy": ratio("h2d_gbps"), "gather": ratio("host_gather_rows_per_s")}

    def differs(self, target: "Machine | None") -> bool:
        return target is not None and any(getattr(target, k) != getattr(self, k) for k in self.KEYS)

    def lines(self) -> list[str]:
        """Each figure in words, with where it came from."""
        units = {"hbm_bytes": lambda v: f"{v / 2**30:.1f} GiB", "hbm_read_gbps": lambda v: f"{v:,.0f} GB/s",
                 "h2d_gbps": lambda v: f"{v:.1f} GB/s", "host_gather_rows_per_s": lambda v: f"{v / 1e6:.1f} Mrow/s",
                 "host_cores": str, "sms": str}
        out = []
        for k in self.KEYS:
            v = getattr(self, k)
            out.append(f"{k} = {units[k](v) if v is not None else 'unknown'} "
                       f"({self.sources.get(k, 'not measured, not given')})")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.KEYS}, "sources": dict(self.sources)}


def _median(vals: Iterable[float | None]) -> float | None:
    vals = [v for v in vals if v]
    return statistics.median(vals) if vals else None


def measured_machine(metas: Sequence[Mapping[str, Any]]) -> Machine:
    """The machine the runs measured: the median of their ceilings, the device they name."""
    m = Machine()
    metas = [as_meta(x) for x in metas]
    ceil = [x.ceilings for x in metas]
    dev = [x.device for x in metas if x.device is not None]
    n = len(metas)
    m.h2d_gbps = _median(c.h2d_gbps for c in ceil)
    m.hbm_read_gbps = _median(c.hbm_read_gbps or c.d2d_gbps for c in ceil)
    mem = _median(d.memory_bytes for d in dev)
    m.hbm_bytes = int(mem) if mem else None
    sms = _median(d.sm_count for d in dev)
    m.sms = int(sms) if sms else None
    rates, threads = [], []
    for c in ceil:
        best: dict[tuple, tuple[float, float]] = {}
        for v in c.host_gather:
            rows, ms = v.rows, v.ms
            if rows and ms:
                k = (v.table_bytes, v.row_bytes)
                if rows > best.get(k, (0, 0))[0]:
                    best[k] = (rows, rows / (ms * 1e-3))
                threads.append(v.threads)
        rates += [r for _, r in best.values()]
    m.host_gather_rows_per_s = _median(rates)
    t = _median(threads)
    m.host_cores = int(t) if t else None
    hbm_src = "hbm_read_gbps" if any(c.hbm_read_gbps for c in ceil) else "d2d_gbps"
    for k, what in (("h2d_gbps", "h2d_gbps"), ("hbm_read_gbps", hbm_src), ("hbm_bytes", "device.memory_bytes"),
                    ("sms", "device.sm_count"), ("host_gather_rows_per_s", "host_gather ceilings, largest rows"),
                    ("host_cores", "host_gather ceilings' threads")):
        if getattr(m, k) is not None:
            m.sources[k] = f"measured: median {what} of {n} run(s)"
    return m


def read_machine_file(path: str | Path) -> dict[str, Any]:
    """A machine description file's keys (TOML, or JSON by its ``.json`` name); MachineError naming
    the file for one that cannot be read or holds an unknown key."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise MachineError(f"--machine {p}: cannot read it ({exc.strerror})") from None
    if p.suffix != ".json" and tomllib is None:  # pragma: no cover -- Python 3.10 without tomli
        raise MachineError(f"--machine {p}: reading TOML needs Python >= 3.11 (tomllib) or the 'tomli' package; "
                           "give the description as JSON (a .json file)")
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise MachineError(f"--machine {p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("machine"), dict) and len(data) == 1:
        data = data["machine"]  # a [machine] table
    if not isinstance(data, dict):
        raise MachineError(f"--machine {p}: expected a table of keys ({', '.join(Machine.KEYS)})")
    bad = [k for k in data if k not in Machine.KEYS]
    if bad:
        raise MachineError(f"--machine {p}: unknown key {bad[0]!r}; allowed: {', '.join(Machine.KEYS)}")
    return data


# ------------------------------------------------------------------ per-row rates from the ceilings

def _slope_per_row(entries: Sequence[tuple[float, float]]) -> float:
    """Seconds per row from (rows, ms) of one ceiling at several row counts: the least-squares
    slope where it is positive, else the largest batch's time per row."""
    rows = [r for r, _ in entries]
    if len(set(rows)) >= _MIN_SLOPE_ROWS:
        slope = float(np.polyfit(rows, [ms for _, ms in entries], 1)[0])
        if slope > 0:
            return slope * 1e-3
    r, ms = max(entries)
    return ms * 1e-3 / r


@dataclass
class _Curve:
    """Per-row seconds of one ceiling kind by (table bytes, row bytes)."""

    by_shape: dict[tuple[int, int], float]

    def latency(self, table: float) -> float | None:
        """The per-row time at ``table`` of the most latency-bound row size measured at each table
        (the smallest per-row time there), log-log interpolated over the tables; past the
        largest table the last segment's slope (>= 0), below the smallest flat."""
        at: dict[int, float] = {}
        for (t, _rb), s in self.by_shape.items():
            at[t] = min(at.get(t, math.inf), s)
        if not at:
            return None
        ts = sorted(at)
        lx, ly = np.log(ts), np.log([at[t] for t in ts])
        x = math.log(max(table, 1.0))
        if x <= lx[0] or len(ts) == 1:
            return float(math.exp(ly[0] if x <= lx[0] else ly[-1]))
        if x >= lx[-1]:
            slope = max(0.0, (ly[-1] - ly[-2]) / (lx[-1] - lx[-2]))
            return float(math.exp(ly[-1] + slope * (x - lx[-1])))
        return float(math.exp(np.interp(x, lx, ly)))

    def exact(self, table: float, row_bytes: int) -> float | None:
        """The per-row time measured at this table (within 2 %) and row size, if any."""
        for (t, rb), s in self.by_shape.items():
            if rb == row_bytes and abs(math.log(t / max(table, 1.0))) < 0.02:
                return s
        return None


class CeilingRates:
    """Per-row seconds from the runs' per-case ceilings (see the module's doc).  ``exclude``:
    (table bytes, row bytes) shapes whose ceilings are left out (a strict shape hold-out)."""

    def __init__(self, metas: Sequence[Mapping[str, Any]], exclude: Iterable[tuple[int, int]] = ()):
        self.exclude = {(int(t), int(rb)) for t, rb in exclude}
        # (memory, order, ids, host_alloc) -> (table, row_bytes) -> [(rows, ms)] (pooled over runs)
        rr: dict[tuple, dict[tuple[int, int], list[tuple[float, float]]]] = {}
        hg: dict[str, dict[tuple[int, int], list[tuple[float, float]]]] = {}
        for m in metas:
            c = as_meta(m).ceilings
            for v in c.random_row:
                shape = self._usable(v)
                if shape is None:
                    continue
                k = (str(v.memory), v.order or "random", v.ids or "uniform", v.host_alloc or "torch")
                rr.setdefault(k, {}).setdefault(shape, []).append((v.rows, v.ms))
            for v in c.host_gather:
                shape = self._usable(v)
                if shape is None:
                    continue
                hg.setdefault(v.ids or "uniform", {}).setdefault(shape, []).append((v.rows, v.ms))
        self.random_row = {k: _Curve({s: _slope_per_row(e) for s, e in d.items()}) for k, d in rr.items()}
        self.host_gather = {k: _Curve({s: _slope_per_row(e) for s, e in d.items()}) for k, d in hg.items()}

    def _usable(self, v: CaseCeiling) -> tuple[int, int] | None:
        """The (table bytes, row bytes) of a ceiling entry with a time and a row count, None where
        it has neither or its shape is left out."""
        if not v.timed:
            return None
        shape = (int(v.table_bytes or 0), int(v.row_bytes or 0))
        return None if self._skip(shape) else shape

    def _skip(self, shape: tuple[int, int]) -> bool:
        t, rb = shape
        return any(rb == x_rb and abs(math.log(max(t, 1) / max(xt, 1))) < 0.02 for xt, x_rb in self.exclude)

    def _pick(self, memory: str, order: str, ids: str, host_alloc: str) -> tuple[_Curve | None, str]:
        """The closest ceiling curve: the same memory, then the order, ids, allocation asked where
        measured (else random order, uniform ids, torch's allocation)."""
        cands = [(k, c) for k, c in self.random_row.items() if k[0] == memory]
        if not cands:
            return None, ""
        def score(kc):  # the asked order, ids, allocation first; else the plain ones (random, uniform, torch)
            (_mem, o, i, a), _ = kc
            return (o not in (order, "random"), o != order, i not in (ids, "uniform"), i != ids,
                    a not in (host_alloc, "torch"), a != host_alloc)
        k, c = min(cands, key=score)
        return c, f"{k[0]} random_row ceiling ({k[1]} order, {k[2]} ids, {k[3]} alloc)"

    def kernel_row_s(self, memory: str, table: float, row_bytes: int, link_gbps: float | None, *,
                     order: str = "random", ids: str = "uniform", host_alloc: str = "torch") -> tuple[float, str]:
        """Seconds per row of a GPU kernel gathering rows of ``row_bytes`` from a ``memory``
        ("pinned" | "device") table of ``table`` bytes; (0, "") where nothing is measured nor
        a link rate known."""
        eff = max(int(row_bytes), SECTOR_BYTES)
        link = eff / (link_gbps * 1e9) if link_gbps else 0.0
        curve, what = self._pick(memory, order, ids, host_alloc)
        if curve is None:
            return link, (f"{memory}: {eff} B over the {link_gbps:.0f} GB/s link (no random_row ceiling)"
                          if link else "")
        exact = curve.exact(table, row_bytes)
        if exact is not None:
            return exact, what + " at this table and row size"
        lat = curve.latency(table) or 0.0
        return max(lat, link), what + " interpolated to this table, and the row's bytes over the link"

    def host_row_s(self, table: float, row_bytes: int, h2d_gbps: float | None, *, ids: str = "uniform") -> \
            tuple[float, float, str]:
        """(gather seconds per row, copy seconds per row, in words) of a host gather of rows of
        ``row_bytes`` from a ``table`` bytes pinned table, then their host->device copy: the
        host_gather ceiling's per-row time less its copy's share (the row's bytes over h2d)."""
        eff = max(int(row_bytes), SECTOR_BYTES)
        copy = eff / (h2d_gbps * 1e9) if h2d_gbps else 0.0
        curve = self.host_gather.get(ids) or self.host_gather.get("uniform") or \
            next(iter(self.host_gather.values()), None)
        if curve is None:
            return 0.0, copy, "no host_gather ceiling: the copy over h2d only"
        # the gather's share of each measured (table, row size): its per-row time less the copy's
        gather = _Curve({(t, rb): max(s - max(rb, SECTOR_BYTES) / (h2d_gbps * 1e9) if h2d_gbps else s, 0.2 * s)
                         for (t, rb), s in curve.by_shape.items()})
        return gather.latency(table) or 0.0, copy, "host_gather ceiling (gather part) interpolated to this table"
