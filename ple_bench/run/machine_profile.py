"""The machine profile: what is measured once per machine and reused by every later run until the
GPU, its driver or torch changes -- today the decode step's compute calibration (how many matmuls
make the "200 us" chain, timed replayed from its graph).

Each run calibrated its own chain before: on one H200 the same suite ran 7 matmuls in one run and 8
in another, so two runs of one commit held their host paths against different compute (a source of
their disagreement that no interval inside a run could see).  Now the first GPU run on a machine
writes the profile, every later run starts from it (its ``meta.json`` says which profile, made by
which run), and a run adds the calibrations the profile lacked.

The profile lives in ``$PLE_BENCH_PROFILE_DIR`` (default ``~/.cache/ple_bench/machine``), one JSON
file per machine key: ``{"key": {...}, "calibration": {...}, "created_by": RUN_ID, "created_at":
ISO, "updated_by": [...]}``.  ``run --calibration FILE`` overrides it; ``run --fresh-calibration``
ignores it (and does not write it).

It keeps the variance components of each repeated case's verdict ratio too (``"components"``: the
newest runs' levels, :mod:`ple_bench.uncertainty`): a group with ``repeat.target_pct`` takes as many
processes as they say its target half-width needs (at most ``repeat.most``); the first run on a
machine takes the suite's number."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

PROFILE_DIR_ENV = "PLE_BENCH_PROFILE_DIR"


def profile_dir() -> Path:
    return Path(os.environ.get(PROFILE_DIR_ENV) or Path.home() / ".cache" / "ple_bench" / "machine")


def machine_key() -> dict[str, str] | None:
    """What the profile is valid for: GPU 0's name and the driver (NVML: no CUDA context in this
    process), torch and its CUDA; None where NVML does not answer (no GPU)."""
    from ..measure.clocks import nvml  # measure loads torch: only a GPU run asks for its machine's key

    lib = nvml()
    if lib is None:
        return None
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(0)
        name = lib.nvmlDeviceGetName(handle)
        driver = lib.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - NVML errors mean "no profile"
        return None
    try:
        import torch  # the version the profile is valid for (a GPU run has torch loaded already)

        torch_version, cuda = str(torch.__version__), str(torch.version.cuda)
    except ImportError:
        return None
    as_text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
    return {"gpu": as_text(name), "driver": as_text(driver), "torch": torch_version, "cuda": cuda}


def profile_path(key: Mapping[str, str], directory: Path | None = None) -> Path:
    digest = hashlib.sha1(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(key.get("gpu", "gpu"))).strip("-").lower()
    return (directory or profile_dir()) / f"{slug}-{digest}.json"


def load(key: Mapping[str, str] | None, directory: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """(path, profile) of ``key``, or None where there is none (or it cannot be read, or it was made
    for another key)."""
    if key is None:
        return None
    path = profile_path(key, directory)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("key") != dict(key) or not isinstance(data.get("calibration"), dict):
        return None
    return path, data


def update(key: Mapping[str, str], calibration: Mapping[str, list], run_id: str,
           directory: Path | None = None) -> tuple[Path, int]:
    """Add the calibrations of ``calibration`` the profile lacks (an entry once written is never
    changed: every later run keeps running the same compute); (path, entries added).  Written
    atomically."""
    path = profile_path(key, directory)
    found = load(key, directory)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    data = found[1] if found else {"key": dict(key), "calibration": {}, "created_by": run_id, "created_at": now,
                                   "updated_by": []}
    added = 0
    for k, v in calibration.items():
        if k not in data["calibration"]:
            data["calibration"][k] = list(v)
            added += 1
    if added:
        if found:
            data.setdefault("updated_by", []).append(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return path, added


#: the runs' variance components a profile keeps per case (the newest)
COMPONENT_RUNS = 5


def add_components(key: Mapping[str, str], found: Mapping[str, Mapping[str, Any]], run_id: str,
                   directory: Path | None = None) -> Path | None:
    """Keep this run's variance components of the verdicts' ratios (pinned case id -> a
    :class:`ple_bench.uncertainty.Components` as JSON) in the profile, the newest
    :data:`COMPONENT_RUNS` runs a case; None where the profile does not exist (a run that used
    ``--calibration`` writes none)."""
    got = load(key, directory)
    if got is None or not found:
        return None
    path, data = got
    store = data.setdefault("components", {})
    for case_id, comp in found.items():
        runs = [c for c in store.get(case_id, []) if c.get("run") != run_id]
        store[case_id] = (runs + [dict(comp, run=run_id)])[-COMPONENT_RUNS:]
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def components_of(data: Mapping[str, Any], case_ids: Any) -> dict[str, Any]:
    """case id -> the pooled :class:`ple_bench.uncertainty.Components` of the runs the profile keeps."""
    from ..uncertainty import Components, pooled  # layer 0, imported where read (the profile module stays small)

    out = {}
    for cid in case_ids:
        parts = [Components(**{k: v for k, v in c.items() if k != "run"})
                 for c in (data.get("components") or {}).get(cid, [])]
        comp = pooled(parts)
        if comp is not None:
            out[cid] = comp
    return out


__all__ = ["PROFILE_DIR_ENV", "profile_dir", "machine_key", "profile_path", "load", "update", "add_components",
           "components_of", "COMPONENT_RUNS"]
