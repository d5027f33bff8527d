"""Run storage: ``results/<run_id>/meta.json`` and ``records.jsonl``.

This format is a public interface (nightly CI and dashboards parse it):

``meta.json``: ``run_id``, ``suite``, ``device`` (name, driver, cuda, memory_bytes,
...), ``torch``, ``triton``, ``python``, ``git_commit``, ``host``, ``ceilings``
(name -> GB/s), ``mode`` (``gpu`` | ``functional``), ``timer``, ``started_at``,
``ended_at``, ``argv``, ``status`` (``running`` | ``complete`` | ``interrupted`` | ``aborted``),
``launcher`` (``self`` | ``torchrun``), ``num_cases`` and ``expected_cases`` (the cases the run
is to record: suite group -> case ids), at its end ``cases_recorded`` and ``not_reached`` (group
-> the case ids without a record: an interrupted or aborted run's).

``records.jsonl``: one JSON object per case, appended and flushed as each case
finishes.  Every record has ``case_id``, ``status`` (ok | skipped | failed |
invalid), ``reason``, every axis of :class:`~ple_bench.spec.case.Case` under its own
name, and (``None`` where not measured) the keys in :data:`RECORD_KEYS`.  Every
field -- its unit, the kinds of case that carry it, its definition -- is in the
schema, :mod:`ple_bench.record` (``python -m ple_bench schema`` prints it), with
``schema_version``.  Derived figures are computed there once, before a record is
written; :func:`load_records` / :func:`load` upgrade older records to the current
schema (:func:`ple_bench.record.upgrade`: ``upgraded_from``, ``missing_fields``), every field of
the type the schema declares (:data:`ple_bench.record.FIELD_TYPES`; :class:`ple_bench.record.Record`
reads them as attributes).

``timer``: ``cuda_event`` (events around calls queued behind a launch-hiding
spin), ``host_sync`` (each sample one synchronized call on the host clock: for
backends that declare ``blocks_host`` and for steps with ``ids_on = "host"``;
the events' time of the same calls is in ``event_samples_ms`` /
``step_event_samples_ms``) or ``host_monotonic`` (functional mode).

Host paths (backends that declare ``reads_ids_on_host``) also carry the
host-gather ceiling of their table and row count (``meta.json``:
``ceilings["host_gather"]["<table bytes>:<rows>:<row bytes>"]``); single-rank lookups
of the other paths the random-row ceiling of their table, row size and id distribution
(``ceilings["random_row"][<record's random_row_ceiling>]``, see
:func:`ple_bench.measure.ceilings.random_row_key`); a table in
host memory, what it cost (:data:`HOST_ALLOC_KEYS`; the axis ``host_alloc`` says
how it was allocated, see :mod:`ple_bench.backends.cuda.host_alloc`).
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import re
import secrets
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

# Keys every record carries (None when not measured for that case): the schema's.
from .record import HOST_ALLOC_KEYS, RECORD_KEYS, SCHEMA_VERSION, coerce_record
from .record import upgrade as _upgrade

#: a record's ``status``: measured, cannot run here, a wrong result, anything else
#: (:mod:`ple_bench.run.outcome` names the exception behind each)
STATUSES = ("ok", "skipped", "failed", "invalid")


def kept_samples(samples: list[float], throttled: list[bool] | None) -> list[float]:
    """The samples a record's summary (``median_ms``, ...) is computed from.

    ``samples_ms`` holds every raw sample; ``samples_throttled`` (one bool per
    sample, same order) flags those taken while the SM clock was throttled.  The
    summary leaves the flagged ones out -- unless every sample is flagged, then
    all are kept (``throttled_samples == n_samples`` says so).  Without flags of
    the same length (records older than the field) every sample is kept.  The
    one definition: the timer's summary and the compare's samples both use it."""
    samples = list(samples)
    if not throttled or len(throttled) != len(samples):
        return samples
    kept = [s for s, t in zip(samples, throttled) if not t]
    return kept if kept else samples


def new_run_id(suite: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{suite}-{secrets.token_hex(2)}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _atomic_write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_json_default))
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


class RunWriter:
    """Writes one run directory; every record is on disk as soon as it is appended."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.meta_path = self.run_dir / "meta.json"
        self.records_path = self.run_dir / "records.jsonl"

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def write_meta(self, meta: dict[str, Any]) -> None:
        _atomic_write_json(self.meta_path, meta)

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        meta = load_meta(self.run_dir) if self.meta_path.exists() else {}
        meta.update(fields)
        self.write_meta(meta)
        return meta

    def append(self, record: dict[str, Any]) -> None:
        if record.get("status") not in STATUSES:
            raise ValueError(f"record status must be one of {STATUSES}, got {record.get('status')!r}")
        full = {key: None for key in RECORD_KEYS}
        full.update(record)
        line = json.dumps(full, sort_keys=True, default=_json_default)
        with open(self.records_path, "a+", encoding="utf-8") as fh:
            # a run killed mid-write leaves a torn last line: start on a fresh line
            if fh.tell() > 0:
                fh.seek(fh.tell() - 1)
                if fh.read(1) != "\n":
                    fh.write("\n")
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def done_case_ids(self) -> set[str]:
        return {r["case_id"] for r in load_records(self.run_dir, upgrade=False)}


class RunFileError(ValueError):
    """A run's file that cannot be read as one: the message names the file (and the line)."""


@dataclass(frozen=True)
class LostLine:
    """A line of ``records.jsonl`` that is not a record (a torn write, a corrupt byte): where it
    is, and the case it names when its ``case_id`` can still be read from the text."""

    path: Path
    line: int
    case_id: str | None
    why: str

    def __str__(self) -> str:
        case = f" (case {self.case_id})" if self.case_id else ""
        return f"{self.path}:{self.line}: {self.why}{case}: the line is left out"


_CASE_ID_RE = re.compile(r'"case_id":\s*"([^"\\]+)"')


def load_meta(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a ple_bench run (no meta.json)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFileError(f"{path}: unreadable ({exc})") from None
    if not isinstance(meta, dict):
        raise RunFileError(f"{path}: not a JSON object")
    return meta


def read_records(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[LostLine]]:
    """The records of a run as stored (the last record of a case wins: a resumed run may
    re-record one), and the lines that are not records.  A line that is not JSON is lost (a
    torn last line, a corrupt byte) but named; unless a later line records its case again
    (a resume after a torn write), it is in the second list.  A line that is JSON but not a
    record (no ``case_id``, not an object) is bad input: :class:`RunFileError`."""
    path = Path(run_dir) / "records.jsonl"
    packed = path.with_name("records.jsonl.gz")
    try:
        if path.exists():
            text = path.read_text(encoding="utf-8", errors="replace")
        elif packed.exists():
            path = packed
            text = gzip.decompress(packed.read_bytes()).decode("utf-8", errors="replace")
        else:
            if not (Path(run_dir) / "meta.json").exists():
                raise FileNotFoundError(f"{run_dir} is not a ple_bench run (no meta.json)")
            return [], []
    except (OSError, EOFError) as exc:
        raise RunFileError(f"{path}: unreadable ({exc})") from None
    latest: dict[str, dict[str, Any]] = {}
    lost: list[LostLine] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            named = _CASE_ID_RE.search(line)
            lost.append(LostLine(path, number, named.group(1) if named else None, f"not valid JSON ({exc.msg})"))
            continue
        if not isinstance(rec, dict):
            raise RunFileError(f"{path}:{number}: not a record (a JSON {type(rec).__name__}, not an object)")
        if not isinstance(rec.get("case_id"), str) or not rec["case_id"]:
            raise RunFileError(f"{path}:{number}: a record without 'case_id'")
        latest[rec["case_id"]] = rec
        lost = [x for x in lost if x.case_id != rec["case_id"]]  # recorded again after the lost line
    return list(latest.values()), lost


#: the lost lines already named on stderr in this process: a command that reads a run several
#: times (the report, then its exports) names each once
_WARNED: set[tuple[str, int]] = set()


def warn_lost(lost: Iterable[LostLine]) -> None:
    """Every lost line, once per process, on stderr with its file and line: no reader drops one
    silently, and none is named twice."""
    for x in lost:
        key = (str(Path(x.path).resolve()), x.line)
        if key not in _WARNED:
            _WARNED.add(key)
            print(f"warning: {x}", file=sys.stderr)


def load_records(run_dir: str | Path, *, upgrade: bool = True,
                 lost: list[LostLine] | None = None, warn: bool = True) -> list[dict[str, Any]]:
    """Records of a run (:func:`read_records`); each line that is not a record is named on stderr
    (and appended to ``lost`` when given; ``warn=False``: only appended, the caller names them).
    An archived run may hold ``records.jsonl.gz`` instead (as in docs/runs/).
    Every field comes as the schema types it, coerced once, here (:func:`ple_bench.record.coerce_record`:
    a number stored as a string or an int is a float, a count an int, an unreadable number None);
    the file is not changed.  ``upgrade``: records of an older schema come in the current one
    (:func:`ple_bench.record.upgrade`, with the run's ceilings); ``False``: in their stored schema.
    Plain dicts (a caller may add its own keys); :class:`ple_bench.record.Record` is their
    read-only view with typed attributes."""
    stored, found = read_records(run_dir)
    records = [coerce_record(r) for r in stored]
    if warn:
        warn_lost(found)
    if lost is not None:
        lost.extend(found)
    if upgrade and any(r.get("schema_version") != SCHEMA_VERSION for r in records):
        meta = load_meta(run_dir) if (Path(run_dir) / "meta.json").exists() else {}
        records = _upgrade(records, meta)
    return records


def not_reached(meta: dict[str, Any], recorded: Iterable[str]) -> dict[str, list[str]] | None:
    """The cases a run was to record (``meta.json``'s ``expected_cases``, by group) that have no
    record, by group; None for a run that predates the list (only ``num_cases`` says how many)."""
    expected = meta.get("expected_cases")
    if not isinstance(expected, dict):
        return None
    have = set(recorded)
    out = {str(group): [c for c in ids if c not in have] for group, ids in expected.items()
           if isinstance(ids, list)}
    return {g: ids for g, ids in out.items() if ids}


def expected_case_ids(meta: dict[str, Any]) -> list[str] | None:
    """Every case a run was to record, in order (None for a run that predates the list)."""
    expected = meta.get("expected_cases")
    if not isinstance(expected, dict):
        return None
    return [c for ids in expected.values() if isinstance(ids, list) for c in ids]


def ensure_writable_dir(path: str | Path, what: str) -> None:
    """Create ``path`` (and its parents) and check a file can be written in it; ``RunFileError``
    naming ``what`` (the flag) otherwise -- before any case runs, not after the first."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise RunFileError(f"{what} {path}: not a writable folder ({exc.strerror or exc})") from None


def load(run_dir: str | Path):
    """The records of a run as a pandas DataFrame (one row per case), in the current
    schema: older records upgraded (``upgraded_from``; ``missing_fields`` lists what an
    old record lacks; ``df.attrs["upgraded"]`` counts them)."""
    import pandas as pd  # pandas: heavy, only the DataFrame view

    records = load_records(run_dir)
    df = pd.DataFrame.from_records(records)
    if df.empty:
        df = pd.DataFrame(columns=list(RECORD_KEYS))
    df.attrs["upgraded"] = sum(1 for r in records if r.get("upgraded_from"))
    return df


def iter_run_dirs(results_dir: str | Path) -> Iterable[Path]:
    root = Path(results_dir)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if (p / "meta.json").exists())
