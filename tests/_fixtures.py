"""The archived runs the tests read: trimmed copies in tests/fixtures/runs (meta.json and
records.jsonl.gz as the run wrote them, every raw sample list strided down to 64 samples and
rounded to 4 significant digits; the summary figures, case ids and axes untouched).

Tests never read docs/runs: what the archive holds changes with the docs, the fixtures only when a
test needs another run.  Each folder keeps its run id (the name docs and findings cite)."""

from __future__ import annotations

from pathlib import Path

FIXTURE_RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"


def fixture_runs() -> list[Path]:
    """Every fixture run folder, oldest first."""
    return sorted(p for p in FIXTURE_RUNS.iterdir() if (p / "meta.json").exists())


def fixture_run(name: str) -> Path:
    """The fixture run whose id is or ends with ``name`` (e.g. ``"paths-b469"``)."""
    found = [p for p in fixture_runs() if p.name == name or p.name.endswith(name)]
    if len(found) != 1:
        raise LookupError(f"tests/fixtures/runs: {len(found)} runs named {name!r}")
    return found[0]
