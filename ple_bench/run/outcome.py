"""How a case ends: one exception family (:class:`CaseOutcome`, each class naming its record status
once).  The executor turns an outcome into the status and reason of its
:class:`~ple_bench.record.CaseResult` (``CaseExecutor.outcome``); ``record.build`` makes the record.

Statuses (:data:`ple_bench.results.STATUSES`): ``ok`` (measured), ``skipped`` (cannot run on this machine; the reason says why),
``invalid`` (a wrong result; never timed), ``failed`` (anything else)."""

from __future__ import annotations

from typing import Any


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

