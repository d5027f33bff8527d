"""The synthetic decode step (``kind="step"`` cases): how much of a PLE lookup a
layer's compute hides, and what a host-memory table costs a whole step.

One step of one layer, on ``num_tokens`` tokens::

    start_prefetch(ids, dp_counts)      # layer entry (pinned: side-stream lookup)
    x = h @ W1 @ W2 ... @ Wn            # main-stream compute: n chained matmuls
    rows = finalize(out=rows)           # join the side stream, reduce, select
    out = x + dequantize(rows) @ P      # the consumer: [tokens, heads*dim] x [heads*dim, hidden]

With ``prefetch=False`` the synchronous ``backend.lookup`` stands where finalize
is.  ``n`` is calibrated on the device to take about ``compute_us``
(:meth:`DecodeStep.calibrate_compute`), or given as ``compute_layers``.  The
weights form a ring larger than the L2 cache so that, as in a real decode step,
the compute streams its weights from memory.  With ``compute="decoder"`` the
matmul chain is replaced by real decoder layers over KV caches
(:class:`ple_bench.compute.DecoderCompute`: ``decoder_layers`` layers of
``decoder_shape``, ``context_len`` cache positions per sequence, one sequence
per token), measured rather than calibrated.

Where the ids are (``ids_on``): ``device`` -- the static id buffer is on the
GPU, refilled by a device copy (ids produced by an earlier kernel); ``host`` --
it is a pinned host tensor, refilled by the host once the previous step has
finished (a server's scheduler knows the next step's ids on the host): kernel
paths copy the ids to the device themselves, host paths gather at once.

Graph modes (:mod:`ple_bench.run.graphs`): ``eager``; ``breakable`` -- the backend
calls (start_prefetch, finalize, lookup) are eager breaks, replayed with this
step's static id buffer and a DP-count list that :meth:`DecodeStep.set_inputs`
updates in place; ``full`` -- the whole step is one graph, possible only where
those calls read nothing on the host (no DP gather) and do no host work on the
calling thread (not a ``blocks_host`` path), or where the backend declares
``host_work_capturable`` (its host gather is a host node of the graph:
``pinned_host_graph``; or posted by the step right after it launches its one graph, which polls a
flag for the rows: ``pinned_host_flag``, a ``posts_ids`` path).  On a CPU everything runs
synchronously and eagerly (functional mode); graph modes are
``NotImplementedError`` ("needs CUDA"), which the runner records as skipped.

:func:`check_step` compares the step's embeddings (bit-exactly) and output with
references before anything is timed; :func:`run_step_case` measures a case and
returns its record fields (see its docstring).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..annotate import annotate
from ..backends.synthetic import synthetic_rows
from ..compute import COMPUTE_KINDS, DecoderCompute, decoder_shape as decoder_shape_of
from ..env import CALIBRATION_ENV, CALIBRATION_FILE, resolve_device
from ..measure.background import BackgroundH2D
from ..measure.fields import lockstep, sm_limit_fields
from ..measure.repeat import Stopwatch, repeat_timed
from ..measure.timer import wait_for_work
from ..record import FIELDS
from ..spec.case import has_compute
from .graphs import BreakableGraph, MODES, eager_break

#: the weights of the compute ring together exceed this (several times the L2)
RING_BYTES = 256 << 20
MAX_RING = 8
#: samples of the in-step compute region (events around the compute)
REGION_SAMPLES = (5, 100)

_CALIBRATION: dict[tuple, tuple[int, float]] = {}


class StepMismatch(RuntimeError):
    """The step's embeddings or output differ from the reference (case invalid)."""


def default_act_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class DecodeStep:
    """One synthetic decode step around ``backend``'s lookup (see the module doc).

    Static buffers: :attr:`ids` (``[num_tokens, heads]`` int64, copied into by
    :meth:`set_inputs`), :attr:`rows` (the finalize output, storage dtype,
    ``[num_tokens, heads*dim]``) and :attr:`out` (``[num_tokens, hidden]``)."""

    def __init__(
        self,
        backend,
        *,
        hidden: int,
        num_tokens: int,
        compute_us: float | None = None,
        compute_layers: int | None = None,
        prefetch: bool = False,
        graph: str = "eager",
        device: torch.device | str | None = None,
        act_dtype: torch.dtype | None = None,
        seed: int = 0,
        graph_factory: Callable[[str], BreakableGraph] | None = None,
        ids_on: str = "device",
        compute: str = "matmul",
        decoder_shape: str = "qwen3-8b",
        decoder_layers: int = 2,
        context_len: int = 4096,
    ) -> None:
        if ids_on not in ("device", "host"):
            raise ValueError(f"unknown ids_on {ids_on!r}; allowed: device, host")
        if graph not in MODES:
            raise ValueError(f"unknown graph mode {graph!r}; allowed: {MODES}")
        if compute not in COMPUTE_KINDS:
            raise ValueError(f"unknown compute {compute!r}; allowed: {', '.join(COMPUTE_KINDS)}")
        if compute == "decoder":
            if compute_us or compute_layers is not None:
                raise ValueError("compute='decoder' is measured, not targeted: give neither compute_us nor "
                                 "compute_layers (decoder_layers sets its depth)")
            shape = decoder_shape_of(decoder_shape)
            if hidden != shape.hidden:
                raise ValueError(f"hidden={hidden}: decoder_shape {shape.name!r} has hidden {shape.hidden}")
        elif (compute_us is None) == (compute_layers is None):
            raise ValueError("give exactly one of compute_us and compute_layers")
        if hidden < 1 or num_tokens < 1:
            raise ValueError(f"hidden and num_tokens must be positive, got {hidden}, {num_tokens}")
        self.backend = backend
        self.device = resolve_device(device) if device is not None else backend.device
        if self.device != backend.device:
            raise ValueError(f"step device {self.device} differs from the backend's {backend.device}")
        self.graph_mode = graph
        self.ids_on = ids_on
        # graph_factory(mode) -> BreakableGraph: replaces the CUDA graphs (tests
        # use fake segments to check the step's breaks on a CPU)
        self._graph_factory = graph_factory
        self.check_mode(graph)
        self.hidden = hidden
        self.num_tokens = num_tokens
        self.prefetch = bool(prefetch)
        self.act_dtype = act_dtype or default_act_dtype(self.device)
        heads, dim = backend.num_heads, backend.embedding_dim
        self.emb_width = heads * dim

        if self.prefetch:
            backend.prepare_prefetch()  # eagerly: allocation is refused during capture

        dev, act = self.device, self.act_dtype
        gen = torch.Generator(device=dev)
        gen.manual_seed(0x5EED + seed)
        if ids_on == "host":
            self.ids = torch.zeros(num_tokens, heads, dtype=torch.int64, pin_memory=dev.type == "cuda")
        else:
            self.ids = torch.zeros(num_tokens, heads, dtype=torch.int64, device=dev)
        self.dp_counts: list[int] = []  # updated in place: the breaks are bound to this list
        self.rows = torch.zeros(num_tokens, self.emb_width, dtype=backend.storage_dtype, device=dev)
        self.out = torch.zeros(num_tokens, hidden, dtype=act, device=dev)
        self.hidden_in = torch.randn(num_tokens, hidden, generator=gen, device=dev).to(act)
        matrix_bytes = hidden * hidden * torch.empty((), dtype=act).element_size()
        ring = max(1, min(MAX_RING, math.ceil(RING_BYTES / matrix_bytes))) if dev.type == "cuda" else 2
        self.compute_kind = compute
        self.decoder: DecoderCompute | None = None
        if compute == "decoder":
            ring = 0  # no matmul ring: the decoder layers are the compute
            self.decoder = DecoderCompute(decoder_shape, layers=decoder_layers, context_len=context_len,
                                          batch=num_tokens, device=dev, dtype=act, seed=seed)
        self.weights = [
            (torch.randn(hidden, hidden, generator=gen, device=dev) / math.sqrt(hidden)).to(act)
            for _ in range(ring)
        ]
        self.proj = (torch.randn(self.emb_width, hidden, generator=gen, device=dev)
                     / math.sqrt(self.emb_width)).to(act)
        self._ping = torch.empty(num_tokens, hidden, dtype=act, device=dev)
        self._pong = torch.empty(num_tokens, hidden, dtype=act, device=dev)

        # The backend calls, as eager breaks bound to this backend (a plain call
        # outside a breakable capture).
        self._start = eager_break(backend.start_prefetch)
        self._finalize = eager_break(backend.finalize)
        self._lookup = eager_break(self._lookup_into)

        self._probe: Stopwatch | None = None
        self._region_breaks = False  # capturing the instrumented graph of compute_region_samples
        self._start_break = eager_break(self._region_start)
        self._stop_break = eager_break(self._region_stop)
        self._runners: dict[tuple[str, str], Callable[[], Any]] = {}
        self.graphs: dict[tuple[str, str], BreakableGraph] = {}  # (body, mode) -> captured graph
        self.compute_target_us = compute_us
        self.matmul_us: float | None = None
        if self.decoder is not None:
            self.compute_matmuls = 0
        elif compute_layers is not None:
            if compute_layers < 0:
                raise ValueError("compute_layers must be >= 0")
            self.compute_matmuls = int(compute_layers)
        else:
            self.compute_matmuls = self.calibrate_compute(float(compute_us))

    # ------------------------------------------------------------ modes
    def check_mode(self, mode: str) -> None:
        """``NotImplementedError`` (-> skipped) where ``mode`` cannot run."""
        replicas = self.backend.topology.replicas
        cls = type(self.backend)
        if mode == "full" and cls.blocks_host and not cls.host_work_capturable:
            raise NotImplementedError(
                f"graph=full: {type(self.backend).__name__} does its lookup on the host (ids on the "
                f"{self.ids_on}), which a CUDA graph cannot capture; use graph=breakable, whose "
                "start_prefetch / finalize are eager breaks around the compute's graph"
            )
        if mode == "full" and replicas > 1:
            raise NotImplementedError(
                f"graph=full captures start_prefetch/finalize, which read host-side DP token "
                f"counts when ETP spans DP (ETP/TP={replicas}); use graph=breakable"
            )
        if mode != "eager" and self.device.type != "cuda" and self._graph_factory is None:
            raise NotImplementedError(f"graph={mode} needs CUDA (CPU functional mode runs eagerly)")

    # ------------------------------------------------------------ inputs
    def set_inputs(self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None) -> None:
        """Copy fresh ids into the static id buffer; update the DP counts in place."""
        if tuple(ids.shape) != tuple(self.ids.shape):
            raise ValueError(f"ids must be {tuple(self.ids.shape)}, got {tuple(ids.shape)}")
        if self.ids_on == "host" and self.device.type == "cuda":
            # the previous step may still be copying from this pinned buffer: a server refills
            # its host-side inputs once the previous step is done (it needs its sampled tokens)
            wait_for_work(self.device)
            _host_copy(self.ids, ids)
        else:
            self.ids.copy_(ids, non_blocking=True)
        self.dp_counts[:] = [int(c) for c in dp_token_counts] if dp_token_counts is not None else []

    # ------------------------------------------------------------ pieces
    def _lookup_into(self, out: torch.Tensor) -> torch.Tensor:
        return self.backend.lookup_into(self.ids, out, self._counts_arg)

    @property
    def _counts_arg(self) -> list[int] | None:
        # the same list object every call (None when the backend reads no counts)
        return self.dp_counts if self.backend.topology.replicas > 1 else None

    def compute(self, n: int | None = None) -> torch.Tensor:
        """The main-stream compute: ``n`` chained matmuls over the weight ring, or the
        decoder layers (``compute="decoder"``; ``n`` does not apply)."""
        if self.decoder is not None:
            return self.decoder(self.hidden_in)
        n = self.compute_matmuls if n is None else n
        x = self.hidden_in
        bufs = (self._ping, self._pong)
        for i in range(n):
            dst = bufs[i % 2]
            torch.mm(x, self.weights[i % len(self.weights)], out=dst)
            x = dst
        return x

    def consume(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``out = x + dequantize(rows) @ proj``."""
        emb = self.backend.dequantize(rows, self.act_dtype)
        if emb.dtype != self.act_dtype:
            emb = emb.to(self.act_dtype)
        return torch.addmm(x, emb, self.proj, out=self.out)

    # ------------------------------------------------------------ bodies
    def body_step(self) -> torch.Tensor:
        """The whole step (the ids are already in :attr:`ids`)."""
        with annotate("decode_step", color="blue"):
            counts = self._counts_arg
            if self.prefetch:
                self._start(self.ids, counts)
            self._mark(True)
            with annotate("compute", color="cyan"):
                x = self.compute()
            self._mark(False)
            if self.prefetch:
                self._finalize(out=self.rows)
            else:
                self._lookup(self.rows)
            return self.consume(x, self.rows)

    def body_lookup(self) -> torch.Tensor:
        """The lookup alone (start_prefetch + finalize, or lookup), no compute."""
        with annotate("step_lookup", color="green"):
            if self.prefetch:
                self._start(self.ids, self._counts_arg)
                return self._finalize(out=self.rows)
            return self._lookup(self.rows)

    def body_compute(self) -> torch.Tensor:
        """The step without the lookup: compute, then the consumer on the rows
        already in :attr:`rows`."""
        with annotate("step_compute", color="cyan"):
            self._mark(True)
            x = self.compute()
            self._mark(False)
            return self.consume(x, self.rows)

    def runner(self, kind: str = "step", mode: str | None = None) -> Callable[[], Any]:
        """A no-argument callable running body ``kind`` (step | lookup | compute)
        in graph ``mode`` (default: this step's); graphs are captured on first use."""
        mode = mode or self.graph_mode
        key = (kind, mode)
        if key in self._runners:
            return self._runners[key]
        body = {"step": self.body_step, "lookup": self.body_lookup, "compute": self.body_compute}[kind]
        self.check_mode(mode)
        if mode == "eager":
            fn: Callable[[], Any] = body
        else:
            if self._graph_factory is not None:
                graph = self._graph_factory(mode)
            else:
                graph = BreakableGraph(mode, device=self.device)
            with annotate(f"capture_{kind}_{mode}", color="gray"):
                graph.capture(body, warmup=2)
            self.graphs[key] = graph
            fn = graph.replay
            if mode == "full" and kind != "compute" and self.ids_on == "host" and type(self.backend).posts_ids:
                fn = self._posting(fn)
        self._runners[key] = fn
        return fn

    def _posting(self, replay: Callable[[], Any]) -> Callable[[], Any]:
        """``replay``, then the step's host ids posted to the backend: a ``posts_ids`` path's host
        work starts once the step's one graph is launched (its graph waits for the rows), off the
        launch's critical path, as a server would start it after launching the step."""
        post, ids = self.backend.post_ids, self.ids

        def launch_then_post() -> None:
            replay()
            post(ids)

        return launch_then_post

    def run(self, mode: str | None = None) -> torch.Tensor:
        self.runner("step", mode)()
        return self.out

    def run_lookup(self, mode: str | None = None) -> torch.Tensor:
        self.runner("lookup", mode)()
        return self.rows

    def run_compute(self, mode: str | None = None) -> torch.Tensor:
        self.runner("compute", mode)()
        return self.out

    def close(self) -> None:
        """Drop the captured graphs (they and the step refer to each other) and the
        weights, so their memory is freed now rather than at the next gc."""
        self.graphs.clear()
        self._runners.clear()
        self.weights = []
        if self.decoder is not None:
            self.decoder.close()

    def compute_record(self) -> dict[str, Any]:
        """The record fields that say what the compute is: ``compute_bytes`` (what one
        compute-alone step reads: the matmul chain's weights or the decoder's weights
        and KV caches, plus the consumer's projection), ``compute_kv_bytes``; for the
        decoder, the matmul-chain fields are None (nothing is calibrated)."""
        element = torch.empty((), dtype=self.act_dtype).element_size()
        proj = self.proj.numel() * element
        if self.decoder is None:
            return {"compute_bytes": self.compute_matmuls * self.hidden * self.hidden * element + proj,
                    "compute_kv_bytes": 0}
        return {"compute_bytes": self.decoder.bytes_read + proj, "compute_kv_bytes": self.decoder.kv_bytes,
                "compute_matmuls": None, "compute_target_us": None, "matmul_us": None}

    @property
    def embeddings(self) -> torch.Tensor:
        """The finalize output of the last step (storage dtype)."""
        return self.rows

    # ------------------------------------------------------------ calibration
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _time_compute_ms(self, n: int, repeats: int = 5) -> float:
        """Median time of ``compute(n)`` in ms as the step runs it: on a GPU replayed from a CUDA
        graph (the step's compute is a graph's, without launch gaps; CUDA events), else eager
        on the host clock (functional mode, or where the capture fails)."""
        if self.device.type == "cuda":
            try:
                return self._time_compute_graph_ms(n, repeats)
            except RuntimeError:
                pass
        return repeat_timed(lambda: self.compute(n), device=self.device, warmup=1, min_repeats=repeats).median_ms

    def _time_compute_graph_ms(self, n: int, repeats: int) -> float:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.compute(n)  # warm-up outside the capture (cuBLAS workspaces)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.compute(n)
        try:
            return repeat_timed(graph.replay, device=self.device, warmup=2, min_repeats=repeats).median_ms
        finally:
            del graph

    def calibrate_compute(self, target_us: float) -> int:
        """Measure the matmuls of the ring and pick how many take ~``target_us``
        (0 for 0).  Cached per device and shape, and agreed over all ranks (the
        largest count), so that the variants of a case run the same compute."""
        if target_us < 0:
            raise ValueError("compute_us must be >= 0")
        if target_us == 0:
            self.matmul_us = None
            return 0
        key = (str(self.device), self.hidden, self.num_tokens, self.act_dtype, len(self.weights),
               float(target_us))
        if key not in _CALIBRATION:
            shared = calibration_key(self.device, self.hidden, self.num_tokens, self.act_dtype,
                                     len(self.weights), float(target_us))
            known = read_run_calibration().get(shared)
            if known is not None:  # measured by an earlier worker of this run: the same compute
                _CALIBRATION[key] = (int(known[0]), float(known[1]))
            else:
                n_cal = max(2 * len(self.weights), 8 if self.device.type == "cuda" else 2)
                per_us = self._time_compute_ms(n_cal, repeats=21) * 1e3 / n_cal
                count = max(1, round(target_us / per_us)) if per_us > 0 else 1
                count = _agree_max(count, self.device)
                _CALIBRATION[key] = (count, per_us)
                write_run_calibration(shared, _CALIBRATION[key])
        count, self.matmul_us = _CALIBRATION[key]
        return count

    # ------------------------------------------------------------ instrumented runs
    def region_mode(self, mode: str) -> str:
        """The graph mode the compute region can be timed in for a step of graph ``mode``: the
        same mode where the region's events can be recorded in it (eager; breakable, where the
        events are eager breaks between the compute's graph segment and the lookup's calls),
        else eager (a full graph: its events would be nodes inside one graph)."""
        if mode == "breakable" and (self.device.type == "cuda" or self._graph_factory is not None):
            return "breakable"
        return "eager"

    def _region_start(self) -> None:
        if self._probe is not None:
            self._probe.start()

    def _region_stop(self) -> None:
        if self._probe is not None:
            self._probe.stop()

    def compute_region_samples(self, body: str, n: int, feed: Callable[[], None] | None = None,
                               warmup: int = 2, mode: str = "eager") -> list[float]:
        """Runs of body ``step`` or ``compute`` in graph ``mode`` (:meth:`region_mode`) with
        the compute region timed (events on the main stream): the compute while the lookup
        runs beside it, or alone.  In breakable mode the events are recorded by eager breaks
        around the compute's graph segment, so the region is the replayed compute, as in the
        case's step (the breaks are in this instrumented graph only, not in the timed one)."""
        probe = Stopwatch(self.device)  # events on the main stream (host clock in functional mode)
        self._probe = probe
        try:
            if mode == "eager":
                fn = {"step": self.body_step, "compute": self.body_compute}[body]
            else:
                fn = self._instrumented(body, mode)  # repeat_timed skips the capture's regions
            return repeat_timed(fn, device=self.device, warmup=warmup, min_repeats=n, before=feed,
                                region=probe).samples_ms
        finally:
            self._probe = None

    def _instrumented(self, body: str, mode: str) -> Callable[[], Any]:
        """Body ``body`` captured in ``mode`` with the region's events as eager breaks."""
        key = (f"{body}_region", mode)
        if key not in self._runners:
            self._region_breaks = True
            try:
                fn = {"step": self.body_step, "compute": self.body_compute}[body]
                graph = self._graph_factory(mode) if self._graph_factory is not None else BreakableGraph(
                    mode, device=self.device)
                with annotate(f"capture_{body}_region_{mode}", color="gray"):
                    graph.capture(fn, warmup=2)
            finally:
                self._region_breaks = False
            self.graphs[key] = graph
            self._runners[key] = graph.replay
        return self._runners[key]

    def _mark(self, start: bool) -> None:
        """Start or stop the region probe: an eager break while an instrumented graph is
        captured (so its replay records the events between segments), else a plain call."""
        if self._probe is None:
            return
        if self._region_breaks:
            (self._start_break if start else self._stop_break)()
        elif start:
            self._probe.start()
        else:
            self._probe.stop()


def _host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for host tensors, as one memmove where both are contiguous of one dtype
    (what a scheduler writing its ids does): torch's copy of 64 KiB or more wakes its intra-op
    thread team, whose threads then compete with a host path's own threads for the cores."""
    if (dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype and dst.numel() == src.numel()
            and src.device.type == "cpu" and dst.device.type == "cpu"):
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())
    else:
        dst.copy_(src)


def calibration_key(device: torch.device, hidden: int, num_tokens: int, act_dtype: torch.dtype, ring: int,
                    target_us: float) -> str:
    """The run-wide name of one compute calibration: the device's model (not its index: every rank of
    a run shares it), the shape, the ring and the target."""
    model = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    timed = "|timed=graph" if device.type == "cuda" else ""  # calibrated from a graph's replay (earlier: eager)
    return f"{model}|hidden={hidden}|tokens={num_tokens}|{act_dtype}|ring={ring}|target_us={target_us:g}{timed}"


def read_run_calibration() -> dict[str, list]:
    """The run's calibrations so far (``$PLE_BENCH_CALIBRATION_FILE``; {} outside a run or before
    the first). Each worker process calibrates on its own otherwise, and two workers of one run
    picked matmul counts 18 us apart on the H200: a pinned step and its resident baseline then ran
    different compute."""
    path = os.environ.get(CALIBRATION_ENV)
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_run_calibration(key: str, value: tuple[int, float]) -> None:
    """Add one calibration to the run's file (rank 0 only; atomically: a crash leaves the old file)."""
    path = os.environ.get(CALIBRATION_ENV)
    if not path or (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        return
    known = read_run_calibration()
    known[key] = [int(value[0]), float(value[1])]
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(known, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_calibration_file(path: Path) -> dict[str, list]:
    """A run's ``calibration.json`` (key -> [matmuls, us per matmul]); ``ValueError`` saying why
    when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
            and not isinstance(v[0], bool) and v[0] >= 0 and isinstance(v[1], (int, float)) and v[1] > 0
            for k, v in data.items()):
        raise ValueError(f"{path} is not a run's calibration.json (an object of key: [matmuls, us per matmul])")
    return data


def seed_calibration(run_dir: Path, calibration: dict[str, list]) -> None:
    """Start the run's calibration file with ``calibration`` (a new run: nothing to keep)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CALIBRATION_FILE).write_text(json.dumps(calibration, indent=1, sort_keys=True), encoding="utf-8")


def _agree_max(value: int, device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64,
                     device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# ---------------------------------------------------------------- correctness
def reference_rows(step: DecodeStep, ids: torch.Tensor, table_seed: int | None,
                    dp_token_counts: Sequence[int] | None) -> torch.Tensor:
    b = step.backend
    if table_seed is not None:
        ref = synthetic_rows(ids.reshape(-1), b.embedding_dim, table_seed, b.storage_dtype)
        return ref.reshape(ids.shape[0], step.emb_width)
    # no seed: the backend's plain synchronous lookup is the reference
    return b.lookup(ids, list(dp_token_counts) if dp_token_counts is not None else None).clone()


def check_step(
    step: DecodeStep,
    id_sets: Sequence[torch.Tensor],
    table_seed: int | None,
    dp_token_counts: Sequence[int] | None = None,
    mode: str | None = None,
) -> None:
    """Run the step (in ``mode``) once per id set, outputs and prefetch buffer
    poisoned first, and compare: the embeddings bit-exactly with
    ``synthetic_rows`` of the ids (or, without ``table_seed``, with the backend's
    plain lookup), and the output with the consumer recomputed from the
    reference rows.  :class:`StepMismatch` on any difference."""
    if not id_sets:
        raise ValueError("check_step needs at least one id set")
    mode = mode or step.graph_mode
    run = step.runner("step", mode)
    tol = 1e-5 if step.act_dtype == torch.float32 else 2e-2
    for i, ids in enumerate(id_sets):
        step.set_inputs(ids, dp_token_counts)
        step.rows.view(torch.uint8).fill_(0x7F)  # e4m3 NaN / huge values: never a valid row
        step.out.fill_(float("nan"))
        buffer = step.backend.prefetch_buffer
        if buffer is not None:
            buffer.view(torch.uint8).fill_(0x7F)
        step._sync()  # the poison lands before the step, whatever its prefetch waits for
        run()
        step._sync()
        step.backend.check_deferred_errors()  # e.g. an id past the table met by a graph's host node
        ref = reference_rows(step, ids, table_seed, dp_token_counts)
        got = step.rows.contiguous().view(torch.uint8)
        want = ref.to(step.rows.device).contiguous().view(torch.uint8)
        if got.shape != want.shape:
            raise StepMismatch(f"step embeddings are {tuple(step.rows.shape)}, reference {tuple(ref.shape)}")
        bad = got != want
        if bool(bad.any()):
            where = torch.nonzero(bad)[0].tolist()
            raise StepMismatch(
                f"graph={mode} prefetch={step.prefetch} id set {i}: {int(bad.sum())} of {bad.numel()} "
                f"embedding bytes differ from the reference lookup (first at token {where[0]})"
            )
        out = step.out.clone()
        expected = torch.addmm(step.compute(), _dequant(step, ref.to(step.rows.device)), step.proj)
        err = (out.float() - expected.float()).abs().max().item()
        scale = max(expected.float().abs().max().item(), 1.0)
        if not math.isfinite(err) or err > tol * scale:
            raise StepMismatch(
                f"graph={mode} prefetch={step.prefetch} id set {i}: step output differs from the "
                f"reference consumer by {err:.4g} (tolerance {tol * scale:.4g})"
            )


def _dequant(step: DecodeStep, rows: torch.Tensor) -> torch.Tensor:
    emb = step.backend.dequantize(rows, step.act_dtype)
    return emb.to(step.act_dtype)


# ---------------------------------------------------------------- one case
def _id_sets(ids) -> list[torch.Tensor]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() == 2:
            return [ids]
        if ids.dim() == 3:
            return list(ids.unbind(0))
        raise ValueError(f"ids must be [tokens, heads] or [sets, tokens, heads], got {tuple(ids.shape)}")
    sets = list(ids)
    if not sets:
        raise ValueError("no id sets given")
    return sets


def _median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None


def _step_keys() -> tuple[str, ...]:
    return tuple(f.name for f in FIELDS if f.kinds == "step" and not f.derived and not f.legacy)


#: the step fields of the record schema (:mod:`ple_bench.record`) that a step measurement fills
STEP_KEYS = _step_keys()


def run_step_case(
    case,
    backend,
    ids,
    dp_token_counts: Sequence[int] | None,
    policy,
    device,
    *,
    table_seed: int | None = None,
    measure_fn: Callable[..., Any] | None = None,
    host_sync_twin: bool = False,
) -> dict[str, Any]:
    """Check, then measure one ``kind="step"`` case; returns record fields.

    ``ids``: ``[tokens, heads]`` or several id sets (``[sets, tokens, heads]`` or
    a list), copied in turn into the static input before each step.
    ``table_seed``: the seed the table was filled with (``fill_synthetic``); the
    reference is ``synthetic_rows`` of it (without it, the backend's plain
    lookup).

    Keys (ms unless noted; ``*_samples_ms`` are the raw samples):
    ``step_ms`` the step in the case's graph mode (also ``median_ms`` /
    ``samples_ms`` and the summary of that measurement); ``lookup_ms`` the
    lookup alone (start_prefetch + finalize, or lookup); ``compute_ms`` the step
    without its lookup (compute + consumer); ``exposed_ms`` = step - compute (the
    lookup time the compute did not hide, break costs included);
    ``compute_in_step_ms`` / ``compute_region_alone_ms`` the compute region in the
    step and alone (events around the matmuls on the main stream), from which
    :func:`ple_bench.record.derive` computes ``compute_slowdown``, as it computes
    ``overlap_efficiency`` against the prefetch-off twin, and ``offload_overhead``
    against the run's resident step (:class:`ple_bench.record.Peers`); ``graph_break_cost_ms`` = breakable step - full
    step (breakable cases on one rank, when a full graph can be captured);
    ``compute_matmuls``, ``matmul_us`` (calibrated), ``compute_target_us``;
    with ``sm_limit`` > 0 (the prefetch side stream on a green context of that
    many SMs), ``sm_limit_granted`` (SMs the driver gave) and ``green_via``.

    ``timer``: ``host_sync`` (synchronized calls, host clock, no spin hold)
    for a host-blocking backend or host ids, else ``cuda_event``; all three
    measurements of a case use the same one.  ``host_sync_twin``: also time the
    step with the host-sync timer (``step_host_sync_ms``, and ``full_step_host_sync_ms``
    for a breakable step's full graph), for a resident step that is the baseline of
    host-timed steps.  ``unstable``: a measurement whose halves disagreed twice
    (:func:`ple_bench.measure.measure`), named in ``unstable_measurements``.

    ``NotImplementedError`` (-> skipped) for what cannot run here;
    :class:`StepMismatch` (-> invalid) for a wrong result."""
    if getattr(case, "kind", "step") != "step":
        raise ValueError(f"run_step_case runs kind='step' cases, got kind={case.kind!r}")
    if getattr(case, "grid_frac", 1.0) != 1.0:
        raise NotImplementedError(
            f"grid_frac={case.grid_frac}: limiting the lookup's grid is not supported by the "
            "reference kernel (one program per id, grid fixed by the batch)"
        )
    device = torch.device(device)
    priority = int(getattr(case, "stream_priority", 0) or 0)
    if priority:
        _apply_stream_priority(backend, priority, case, device)
    sm_limit = int(getattr(case, "sm_limit", 0) or 0)
    if sm_limit:
        _apply_sm_limit(backend, sm_limit, case, device)
    if measure_fn is None:
        from ..measure import measure as measure_fn  # noqa: N813
    background = None
    if getattr(case, "h2d_background", False):
        # every measurement of the step with a host→device copy kept busy beside it (the link shared)
        background = BackgroundH2D(device)
        measure_fn = background.wrap(measure_fn)
    sets = placed_id_sets(case, backend, ids, device)
    counts = list(dp_token_counts) if dp_token_counts is not None else None
    multi = backend.topology.world_size > 1
    pol = lockstep(policy) if multi else policy
    host_sync = step_timed_host_sync(case, backend)

    step = step_for_case(case, backend, sets[0].shape[0], device)
    try:
        rec = _measure_step(step, case, sets, counts, table_seed, pol, device, multi,
                            measure_fn, host_sync, host_sync_twin)
        rec.update(step.compute_record())
    finally:
        step.close()
    rec.update(sm_limit_fields(case, backend))
    rec["background_h2d_gbps"] = background.gbps if background is not None else None
    rec["compute_slowdown_note"] = None
    computes = has_compute({"compute": getattr(case, "compute", "matmul"), "compute_us": case.compute_us})
    if type(backend).blocks_host and case.graph == "eager" and computes:
        # the thread that does the host lookup also launches the eager compute: a slower compute
        # region could be late launches, not a slower GPU -- graph-replayed compute measures it
        rec["compute_slowdown_note"] = (f"{case.impl} does its lookup on the host thread that launches the "
                                        "eager compute; compute_slowdown is measured with graph-replayed "
                                        "compute (graph = breakable)")
    return rec


def placed_id_sets(case, backend, ids, device) -> list[torch.Tensor]:
    """The id sets where the case's ``ids_on`` puts the step's static input: pinned host
    tensors for host ids (on a GPU), the backend's device for device ids."""
    device = torch.device(device)
    if getattr(case, "ids_on", "device") == "host":
        sets = [t.to("cpu") for t in _id_sets(ids)]
        if device.type == "cuda":
            sets = [t if t.is_pinned() else t.pin_memory() for t in sets]
        return sets
    return [t.to(backend.device) for t in _id_sets(ids)]


def step_timed_host_sync(case, backend) -> bool:
    """Whether a step case is timed as synchronized calls on the host clock (``host_sync``): a
    backend that does its lookup on the host thread, or ids refilled on the host."""
    return bool(type(backend).blocks_host) or getattr(case, "ids_on", "device") == "host"


def step_for_case(case, backend, num_tokens: int, device) -> DecodeStep:
    """The :class:`DecodeStep` of a step case (matmul chain or decoder compute, the case's
    graph mode, prefetch and ``ids_on``): the one constructor of a case's step, used by the
    engine and by ``pytest suites/``."""
    decoder = getattr(case, "compute", "matmul") == "decoder"
    return DecodeStep(
        backend, hidden=case.hidden, num_tokens=num_tokens,
        compute_us=None if decoder else case.compute_us,
        prefetch=case.prefetch, graph=case.graph, device=torch.device(device),
        ids_on=getattr(case, "ids_on", "device"),
        **({"compute": "decoder", "decoder_shape": case.decoder_shape, "decoder_layers": case.decoder_layers,
            "context_len": case.context_len} if decoder else {}),
    )


class StepFeed:
    """What every timed call of a step case does: copy the next id set into the step's static
    input (:meth:`DecodeStep.set_inputs`, rotating through ``sets``), then run a runner.

    The engine times ``feed.timed(runner)`` for every measurement of a case (step, lookup,
    compute, the full-graph twin) and feeds the compute-region runs with ``feed()``;
    ``pytest suites/`` times the very same callable, so both timers time the same work: the
    id refill (a device copy, or for host ids a device sync and a host copy) is inside every
    sample of both."""

    def __init__(self, step: DecodeStep, sets: Sequence[torch.Tensor],
                 counts: Sequence[int] | None = None) -> None:
        if not sets:
            raise ValueError("a step feed needs at least one id set")
        self.step = step
        self.sets = list(sets)
        self.counts = list(counts) if counts is not None else None
        self.position = 0

    def __call__(self) -> None:
        self.step.set_inputs(self.sets[self.position % len(self.sets)], self.counts)
        self.position += 1

    def timed(self, runner: Callable[[], Any]) -> Callable[[], None]:
        """``runner`` after the next id set is fed: the callable a step case's samples time."""
        def fn() -> None:
            self()
            runner()
        return fn


def _measure_step(step: DecodeStep, case, sets, counts, table_seed, pol, device, multi,
                  measure_fn, host_sync: bool = False,
                  host_sync_twin: bool = False) -> dict[str, Any]:
    check_step(step, sets, table_seed, counts)

    feed = StepFeed(step, sets, counts)
    timed = feed.timed

    unstable: list[str] = []

    def sample(runner: Callable[[], Any], label: str, sync: bool = host_sync):
        kwargs = {"host_sync": True} if sync else {}
        m = measure_fn(timed(runner), device=device, policy=pol, cold_l2=False, label=label, **kwargs)
        if getattr(m, "unstable", False):
            unstable.append(label)
        return m

    step_m = sample(step.runner("step"), "step")
    lookup_m = sample(step.runner("lookup"), "step_lookup")
    compute_m = sample(step.runner("compute"), "step_compute")

    n_region = max(REGION_SAMPLES[0], min(REGION_SAMPLES[1], len(step_m.samples_ms)))
    region_mode = step.region_mode(case.graph)
    in_step = step.compute_region_samples("step", n_region, feed, mode=region_mode)
    alone = step.compute_region_samples("compute", n_region, feed, mode=region_mode)

    rec: dict[str, Any] = {}
    stats = step_m.stats()
    for key in ("median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "iqr_ms", "cv",
                "noise", "n_samples", "throttled_samples", "dropped_samples", "sm_clock_mhz"):
        if key in stats:
            rec[key] = stats[key]
    step_ms = stats["median_ms"]
    lookup_ms = lookup_m.stats()["median_ms"]
    compute_ms = compute_m.stats()["median_ms"]
    exposed = step_ms - compute_ms
    rec.update(
        step_ms=step_ms, step_samples_ms=list(step_m.samples_ms),
        median_ms=step_ms, samples_ms=list(step_m.samples_ms), samples_throttled=list(step_m.throttled),
        lookup_ms=lookup_ms, lookup_samples_ms=list(lookup_m.samples_ms),
        compute_ms=compute_ms, compute_samples_ms=list(compute_m.samples_ms),
        compute_in_step_ms=_median(in_step), compute_in_step_samples_ms=in_step,
        compute_region_alone_ms=_median(alone), compute_region_alone_samples_ms=alone,
        compute_region_graph=region_mode,
        exposed_ms=exposed,
        timer=getattr(step_m, "timer", "cuda_event" if device.type == "cuda" else "host_monotonic"),
        stopped_by=getattr(step_m, "stopped_by", None),
        compute_matmuls=step.compute_matmuls, compute_target_us=case.compute_us,
        matmul_us=step.matmul_us,
    )
    twin_wanted = host_sync_twin and not host_sync
    rec["step_host_sync_ms"] = rec["step_host_sync_samples_ms"] = None
    if twin_wanted:
        twin = sample(step.runner("step"), "step_host_sync", sync=True)
        rec.update(step_host_sync_ms=twin.stats()["median_ms"], step_host_sync_samples_ms=list(twin.samples_ms))
    if getattr(step_m, "event_samples_ms", None):
        rec["step_event_samples_ms"] = list(step_m.event_samples_ms)

    rec["graph_break_cost_ms"] = rec["full_step_ms"] = rec["full_step_samples_ms"] = None
    rec["full_step_host_sync_ms"] = rec["full_step_host_sync_samples_ms"] = None
    if case.graph == "breakable" and not multi:
        try:
            step.check_mode("full")
            check_step(step, sets, table_seed, counts, mode="full")
            full_m = sample(step.runner("step", "full"), "step_full")
        except NotImplementedError as exc:
            rec["graph_break_cost_note"] = str(exc)
        else:
            full_ms = full_m.stats()["median_ms"]
            rec.update(full_step_ms=full_ms, full_step_samples_ms=list(full_m.samples_ms),
                       graph_break_cost_ms=step_ms - full_ms)
            if twin_wanted:  # the full graph on the host-sync timer: the baseline of host-timed steps
                full_sync = sample(step.runner("step", "full"), "step_full_host_sync", sync=True)
                rec.update(full_step_host_sync_ms=full_sync.stats()["median_ms"],
                           full_step_host_sync_samples_ms=list(full_sync.samples_ms))
    rec["unstable"] = bool(unstable)
    rec["unstable_measurements"] = unstable or None
    return rec


def _apply_side_stream_setting(backend, name: str, value: int, case, device: torch.device,
                               what: str, refusal: str = "") -> None:
    """Check that a side-stream setting (``stream_priority``, ``sm_limit``) can apply —
    CUDA, prefetch on, a backend with a side stream and that setting — and set it on
    the backend before its side stream exists.  ``NotImplementedError`` -> skipped."""
    if device.type != "cuda":
        raise NotImplementedError(f"{name}={value} needs CUDA (functional mode has no streams)")
    if not (case.prefetch and type(backend).supports_prefetch):
        raise NotImplementedError(
            f"{name} {what}; impl={case.impl} prefetch={case.prefetch} launches no side stream"
        )
    if refusal:
        raise NotImplementedError(f"{name}={value}: {refusal}")
    backend.set_side_stream_setting(name, value)


def _apply_stream_priority(backend, priority: int, case, device: torch.device) -> None:
    _apply_side_stream_setting(backend, "stream_priority", priority, case, device,
                               "sets the prefetch side stream's priority")


def _apply_sm_limit(backend, sm_limit: int, case, device: torch.device) -> None:
    """``sm_limit``: the side stream on a green context of that many SMs (see backends/cuda/green.py)."""
    _apply_side_stream_setting(backend, "sm_limit", sm_limit, case, device,
                               "limits the prefetch side stream's SMs",
                               refusal=type(backend).sm_limit_refusal)
