"""How a case ends: one exception family (:class:`CaseOutcome`, each class naming its record status
once) and :func:`case_record`, the record every path (pool, torchrun) builds from an outcome.

Statuses (:data:`ple_bench.results.STATUSES`): ``ok`` (measured), ``skipped`` (cannot run on this machine; the reason says why),
``invalid`` (a wrong result; never timed), ``failed`` (anything else)."""

from __future__ import annotations

from typing import Any

from ..results import now_iso
from ..spec.case import Case


class CaseOutcome(Exception):
    """A case that ended without a measurement, for a reason the message gives; ``status`` is the
    record's."""

    status = "failed"

    def __init__(self, message: str = "", fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        #: record fields known although nothing was measured (a served step's capacity rule)
        self.fields: dict[str, Any] = dict(fields or {})


class SkipCase(CaseOutcome):
    """The case cannot run on this machine; the message is the reason."""

    status = "skipped"


class InvalidCase(CaseOutcome):
    """The case computed a wrong result; it is recorded and never timed."""

    status = "invalid"


def case_record(case: Case, mode: str | None, status: str, reason: str = "", result: dict | None = None) -> dict:
    """A case's record: its id, outcome, axes and world size, then what it measured."""
    rec: dict[str, Any] = {"case_id": case.case_id, "status": status, "reason": reason,
                           "mode": mode, "finished_at": now_iso()}
    rec.update(case.axes())
    rec["world_size"] = case.world_size
    if result:
        rec.update(result)
    return rec
