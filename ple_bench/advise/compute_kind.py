"""The compute a decode step hides its lookup behind, as an input of ``advise`` and its model.

Two kinds, never pooled: the synthetic **matmul chain** (``compute = "matmul"``: compute-bound, its
length set by ``compute_us``) and **decoder layers** (``compute = "decoder"``: memory-bound, their
time measured, set by the shape, the layer count and the KV cache's context length).  ``advise``
takes the kind on its command line (``--compute``, :func:`parse_compute`):

* ``us:<microseconds>`` -- the matmul chain of that length (``--compute-us N`` is ``us:N``);
* ``decoder:<layers>x<context>`` or ``decoder:<shape>:<layers>x<context>`` -- that many decoder
  layers over a KV cache of ``context`` positions per sequence (shape default ``qwen3-8b``,
  :data:`ple_bench.compute.DECODER_SHAPES`).

:func:`records_of_compute` keeps the step records of the asked kind (the matmul chain: every
compute length, ``advise`` takes the nearest; the decoder: the asked shape at the nearest measured
layers x context), so the measured ranking and the what-if model are calibrated on that kind only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..record import as_record

DEFAULT_DECODER_SHAPE = "qwen3-8b"
_US = re.compile(r"^us:(?P<us>[0-9]+(\.[0-9]*)?|\.[0-9]+)$")
_DECODER = re.compile(r"^decoder:(?:(?P<shape>[a-z0-9_.-]+):)?(?P<layers>[0-9]+)x(?P<context>[0-9]+)$")
EXAMPLES = "us:200 (a 200 us matmul chain) or decoder:2x2048 (2 qwen3-8b decoder layers over a 2048-token KV cache)"


@dataclass(frozen=True)
class ComputeAsk:
    """One compute: ``kind`` "matmul" (``compute_us``) or "decoder" (``shape``, ``layers``, ``context``)."""

    kind: str
    compute_us: float = 0.0
    shape: str = ""
    layers: int = 0
    context: int = 0

    @property
    def spec(self) -> str:
        """The ``--compute`` spelling."""
        if self.kind == "decoder":
            return f"decoder:{self.shape}:{self.layers}x{self.context}"
        return f"us:{self.compute_us:g}"

    @property
    def label(self) -> str:
        """In words (as :func:`ple_bench.report.verdict.compute_label` says it)."""
        if self.kind == "decoder":
            return f"{self.layers} {self.shape} decoder layers over a {self.context}-token KV cache"
        return f"a {self.compute_us:g} us matmul chain"


def parse_compute(spec: str) -> ComputeAsk:
    """``us:<us>`` | ``decoder:[<shape>:]<layers>x<context>``; ValueError naming what is wrong."""
    s = str(spec).strip().lower()
    m = _US.match(s)
    if m:
        return ComputeAsk("matmul", compute_us=float(m.group("us")))
    m = _DECODER.match(s)
    if m:
        # imported here, not at the top: ple_bench.compute imports torch, which advise answering from
        # stored runs (and refusing bad input in seconds) does not otherwise load
        from ..compute import DECODER_SHAPES

        shape = m.group("shape") or DEFAULT_DECODER_SHAPE
        if shape not in DECODER_SHAPES:
            raise ValueError(f"{spec!r}: unknown decoder shape {shape!r}; known: {', '.join(DECODER_SHAPES)}")
        layers, context = int(m.group("layers")), int(m.group("context"))
        if layers < 1 or context < 1:
            raise ValueError(f"{spec!r}: layers and context must be >= 1")
        return ComputeAsk("decoder", shape=shape, layers=layers, context=context)
    raise ValueError(f"{spec!r} is not a compute; give {EXAMPLES}")


def compute_of_record(r: Mapping[str, Any]) -> ComputeAsk:
    """The compute a step record measured."""
    r = as_record(r)
    if str(r.compute or "matmul") == "decoder":
        return ComputeAsk("decoder", shape=str(r.decoder_shape or DEFAULT_DECODER_SHAPE),
                          layers=int(r.decoder_layers or 0), context=int(r.context_len or 0))
    return ComputeAsk("matmul", compute_us=float(r.compute_us or 0.0))


def compute_kind(r: Mapping[str, Any]) -> str:
    """What the model never pools across: "matmul" (its length is a variable the model fits), or
    one decoder configuration "decoder:<shape>:<layers>x<context>" (its time is measured, not set)."""
    c = compute_of_record(r)
    return c.spec if c.kind == "decoder" else "matmul"


def _distance(a: ComputeAsk, b: ComputeAsk) -> float:
    return abs(math.log(a.layers / b.layers)) + abs(math.log(a.context / b.context))


def records_of_compute(records: Sequence[Mapping[str, Any]], ask: ComputeAsk) -> tuple[list, ComputeAsk, list[str]]:
    """(the step records of ``ask``'s kind, the compute they measured, notes).  The matmul chain:
    every matmul record (the measured compute is the asked one; ``advise`` takes the nearest length);
    the decoder: the records of the asked shape at the nearest measured layers x context (log
    distance), with a note where it is not the asked one.  ValueError where the runs hold none,
    naming the computes they hold."""
    steps = [r for r in records if r.get("kind") == "step"]
    have = sorted({compute_of_record(r).spec if compute_of_record(r).kind == "decoder" else "us:*" for r in steps})
    if ask.kind == "matmul":
        kept = [r for r in steps if compute_of_record(r).kind == "matmul"]
        if not kept:
            raise ValueError("no step with the matmul chain in the runs given (they hold: "
                             f"{', '.join(have) or 'none'})")
        return kept, ask, []
    same = [r for r in steps if compute_of_record(r).kind == "decoder" and compute_of_record(r).shape == ask.shape]
    if not same:
        raise ValueError(f"no step with {ask.shape} decoder layers in the runs given (they hold: "
                         f"{', '.join(have) or 'none'}; run the decoder suite: "
                         "python -m ple_bench run --suite decoder)")
    measured = min({compute_of_record(r) for r in same}, key=lambda c: (_distance(c, ask), c.layers, c.context))
    kept = [r for r in same if compute_of_record(r) == measured]
    notes = [] if measured == ask else [f"measured with {measured.label}, not the asked {ask.label} (the nearest "
                                        "measured decoder compute; a longer context or more layers hide more)"]
    return kept, measured, notes


__all__ = ["ComputeAsk", "parse_compute", "compute_of_record", "compute_kind", "records_of_compute", "EXAMPLES",
           "DEFAULT_DECODER_SHAPE"]
