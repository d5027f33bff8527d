"""A measurement as record fields (:func:`measurement_fields`), the side stream's SMs a case was
granted (:func:`sm_limit_fields`), and the policy every rank of a multi-rank case measures under
(:func:`lockstep`)."""

from __future__ import annotations

import dataclasses
from typing import Any

#: the summary statistics a lookup's record takes from its measurement (``Measurement.stats()``)
SUMMARY_KEYS = ("median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "iqr_ms", "cv", "n_samples",
                "throttled_samples")


def lockstep(policy):
    """Every rank must take the same number of samples when the timed function holds a collective
    (the DP gather, the ETP reduce), or a collective inside it would wait forever.  A policy that is
    not a dataclass with sample counts is returned as it is."""
    if not dataclasses.is_dataclass(policy):
        return policy
    names = {f.name for f in dataclasses.fields(policy)}
    if not {"min_samples", "max_samples"} <= names:
        return policy
    n = max(policy.min_samples, min(policy.max_samples, 30))
    changes: dict[str, Any] = {"min_samples": n, "max_samples": n}
    for name, value in (("max_time_s", 1e9), ("min_time_s", 0.0), ("max_noise", 0.0), ("warmup_ms", 0.0),
                        ("remeasure_unstable", False)):
        if name in names:
            changes[name] = value
    return dataclasses.replace(policy, **changes)


def measurement_fields(meas) -> dict[str, Any]:
    """A lookup measurement's record fields: its summary, its samples and how they were taken."""
    stats = meas.stats()
    out = {k: stats.get(k) for k in SUMMARY_KEYS}
    out["samples_ms"] = list(meas.samples_ms)
    out["samples_throttled"] = list(meas.throttled)
    # host_sync: the CUDA events' time of the same calls (the schema's field; None for the other timers)
    out["event_samples_ms"] = list(meas.event_samples_ms) if getattr(meas, "event_samples_ms", None) else None
    out["timer"] = meas.timer
    out["cold_l2"] = meas.cold_l2  # the L2 was flushed before every sample
    clocks = [c for c in meas.sm_clock_mhz if c is not None]
    out["sm_clock_mhz"] = sorted(clocks)[len(clocks) // 2] if clocks else None
    out["stopped_by"] = meas.stopped_by
    out["unstable"] = bool(getattr(meas, "unstable", False))
    return out


def sm_limit_fields(case, backend) -> dict[str, Any]:
    """``sm_limit_granted`` (SMs the driver gave the side stream's green context) and ``green_via``
    (how it was made) for a case with ``sm_limit`` > 0; nothing otherwise."""
    if not getattr(case, "sm_limit", 0):
        return {}
    return {"sm_limit_granted": backend.sm_limit_granted, "green_via": backend.green_via}
