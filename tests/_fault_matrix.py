"""A fault matrix: a suite whose cases run in a planned order, faults planted between good cases,
for the CPU test (tests/test_fault_matrix.py) and the GPU one (tests/gpu/test_fault_matrix_gpu.py).

The runner orders cases by world size, topology, then ``vocab_size`` (``run.loop.order_cases``), so
each step gets its own group with the next vocab size; a step that needs a table of a given size
(larger than HBM, larger than host memory) gets it through its row width, ``dim``, at that vocab
size.  :func:`planned_order` is checked against the runner's own order before anything runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ple_bench.spec.case import Case

BASE_VOCAB = 4096
GOOD_DIM = 16

TIMING = """
[suite]
description = "fault matrix: faults planted between good cases"
[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 5
max_time_s = 0.2
[defaults]
dtype = "bf16"
num_heads = 2
num_tokens = 4
"""


@dataclass
class Step:
    name: str  # what the step is, for messages
    impl: str
    expect: str  # the status the record must have
    reason: tuple[str, ...] = ()  # substrings its reason must hold (any of them)
    table_bytes: int | None = None  # at least this many bytes (through dim), else a small table
    axes: dict = field(default_factory=dict)


def write_suite(path: Path, steps: list[Step]) -> list[int]:
    """Write the suite; returns each step's vocab size (its identity in the records)."""
    text = [TIMING]
    vocabs = []
    for i, step in enumerate(steps):
        vocab = BASE_VOCAB + i
        dim = GOOD_DIM if step.table_bytes is None else -(-step.table_bytes // (vocab * 2))  # bf16
        vocabs.append(vocab)
        axes = {"name": f"{i:02d} {step.name}", "impl": step.impl, "vocab_size": vocab, "dim": dim, **step.axes}
        text.append("[[group]]")
        text += [f"{k} = {json.dumps(v)}" for k, v in axes.items()]
        text.append("")
    path.write_text("\n".join(text))
    return vocabs


def planned_order(cases: list[Case]) -> list[int]:
    """The vocab sizes of ``cases`` in the order the runner runs them."""
    from ple_bench.run.loop import order_cases

    return [c.vocab_size for c in order_cases(cases)]


def check_records(records: list[dict], steps: list[Step], vocabs: list[int]) -> None:
    """Every step has exactly one record, in the planned order, with its expected status and reason."""
    assert [r["vocab_size"] for r in records] == vocabs, "records out of the planned order"
    for rec, step in zip(records, steps):
        where = f"{step.name} ({rec['case_id']}): {rec['status']}: {rec['reason']}"
        assert rec["status"] == step.expect, where
        if step.reason:
            assert any(s in rec["reason"] for s in step.reason), where
        if step.expect == "invalid":  # wrong rows: never timed
            assert rec["median_ms"] is None, where
        if step.expect == "ok":
            assert rec["reason"] == "" and rec["impl"] == step.impl and rec["n_samples"] >= 3, where
            assert rec["median_ms"] > 0, where
