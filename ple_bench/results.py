"""Run storage: ``results/<run_id>/meta.json`` and ``records.jsonl``.

This format is a public interface (nightly CI and dashboards parse it):

``meta.json``: ``run_id``, ``suite``, ``device`` (name, driver, cuda, memory_bytes,
...), ``torch``, ``triton``, ``python``, ``git_commit``, ``host``, ``ceilings``
(name -> GB/s), ``mode`` (``gpu`` | ``functional``), ``timer``, ``started_at``,
``ended_at``, ``argv``, ``status`` (``running`` | ``complete`` | ``interrupted`` | ``aborted``),
``launcher`` (``self`` | ``torchrun``).

``records.jsonl``: one JSON object per case, appended and flushed as each case
finishes.  Every record has ``case_id``, ``status`` (ok | skipped | failed |
invalid), ``reason``, every axis of :class:`~ple_bench.case.Case` under its own
name, and (``None`` where not measured) the keys in :data:`RECORD_KEYS`.

``timer``: ``cuda_event`` (events around calls queued behind a launch-hiding
spin), ``host_sync`` (each sample one synchronized call on the host clock: for
backends that declare ``blocks_host`` and for steps with ``ids_on = "host"``;
the events' time of the same calls is in ``event_samples_ms`` /
``step_event_samples_ms``) or ``host_monotonic`` (functional mode).

Host paths (backends that declare ``reads_ids_on_host``) also carry the
host-gather ceiling of their table and row count (``meta.json``:
``ceilings["host_gather"]["<table bytes>:<rows>:<row bytes>"]``):
``host_gather_ceiling_ms`` (ms per gather), ``host_gather_ceiling_rows_per_s``
(rows/s), and their share of it, in percent of its rows/s:
``pct_of_host_gather_ceiling`` (lookups, from ``median_ms``) or
``lookup_pct_of_host_gather_ceiling`` (steps, from ``lookup_ms``).  Resident
(``device``) steps timed by ``cuda_event`` also carry ``step_host_sync_ms``
(the same step, host-sync timer): the like-for-like baseline of host-blocking
paths; ``offload_baseline`` / ``offload_baseline_timer`` name the resident step
that ``offload_overhead`` is measured against.

What a table in host memory cost (:data:`HOST_ALLOC_KEYS`; every case of a
backend whose table is in host memory, ``None`` for the others).  The axis
``host_alloc`` says how it was allocated (``torch`` | ``exact`` | ``exact_huge``,
see :mod:`ple_bench.backends.host_alloc`).  One allocation serves every case that
reuses the table; those cases carry its figures and ``table_reused = true``.

* ``pinned_bytes`` (bytes): bytes page-locked for this rank's shard (torch: the
  power-of-two block; exact: the page-rounded mapping); 0 in functional mode,
  where nothing is pinned.
* ``host_table_bytes`` (bytes): host bytes the allocation reserves (as
  ``pinned_bytes`` on a GPU; in functional mode the unpinned size).
* ``table_alloc_s`` (seconds): to allocate and pin the shard (``cudaHostAlloc``
  inside torch, or map + ``cudaHostRegister``).
* ``table_fill_s`` (seconds): to fill the shard with its synthetic rows and check
  it loaded.
* ``host_mem_free_before_bytes`` / ``host_mem_free_after_bytes`` (bytes):
  MemAvailable of ``/proc/meminfo`` before the table was allocated and after it
  was filled (this rank's view; ranks allocate concurrently).
* ``host_alloc_from_cache`` (bool): torch mode on a GPU: the block came from
  torch's cache of freed pinned blocks (nothing was pinned anew: then
  ``table_alloc_s`` is not a pinning time); ``None`` otherwise.
* ``host_alloc_note`` (text): how the memory was allocated, in words.
* ``table_reused`` (bool): the case ran on a table an earlier case allocated.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from pathlib import Path
from typing import Any, Iterable

STATUSES = ("ok", "skipped", "failed", "invalid")

# Keys every record carries (None when not measured for that case).
RECORD_KEYS = (
    "case_id", "status", "reason", "timer", "mode",
    "median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "iqr_ms", "cv",
    "n_samples", "samples_ms",
    "hot_median_ms", "hot_samples_ms",  # warm-L2 measurement
    "graph_median_ms", "graph_samples_ms",  # CUDA-graph replay of the lookup alone
    "sm_clock_mhz", "throttled_samples", "samples_throttled",
    "bytes_moved", "rows", "gbps", "rows_per_s", "ceiling", "ceiling_gbps", "pct_of_ceiling",
)
# What a table in host memory cost (documented above).
HOST_ALLOC_KEYS = (
    "pinned_bytes", "host_table_bytes", "table_alloc_s", "table_fill_s",
    "host_mem_free_before_bytes", "host_mem_free_after_bytes", "host_alloc_from_cache",
    "host_alloc_note", "table_reused",
)
RECORD_KEYS += HOST_ALLOC_KEYS


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
        return {r["case_id"] for r in load_records(self.run_dir)}


def load_meta(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a ple_bench run (no meta.json)")
    return json.loads(path.read_text())


def load_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Records of a run; a torn last line (a run killed mid-write) is ignored.
    An archived run may hold ``records.jsonl.gz`` instead (as in docs/runs/)."""
    path = Path(run_dir) / "records.jsonl"
    packed = path.with_name("records.jsonl.gz")
    if path.exists():
        text = path.read_text(encoding="utf-8")
    elif packed.exists():
        import gzip

        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    else:
        if not (Path(run_dir) / "meta.json").exists():
            raise FileNotFoundError(f"{run_dir} is not a ple_bench run (no meta.json)")
        return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    # A resumed run may re-record a case; the last record wins.
    latest: dict[str, dict[str, Any]] = {}
    for rec in out:
        latest[rec["case_id"]] = rec
    return list(latest.values())


def load(run_dir: str | Path):
    """The records of a run as a pandas DataFrame (one row per case)."""
    import pandas as pd

    records = load_records(run_dir)
    df = pd.DataFrame.from_records(records)
    if df.empty:
        df = pd.DataFrame(columns=list(RECORD_KEYS))
    return df


def iter_run_dirs(results_dir: str | Path) -> Iterable[Path]:
    root = Path(results_dir)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if (p / "meta.json").exists())
