"""The served decode step (``kind = "serve"`` cases): the whole decode step of a model at the batch a
table placement leaves HBM for, as a server runs it.

One step, on ``serve_batch`` sequences of one token each (:class:`ServeStep`)::

    lookup issued                          # hbm: the one-kernel gather (ids on the device)
                                           # host: the posted flag path (ids on the host; the host
                                           #       posts the gather right after launching the graph)
    x = embed[tokens]
    x = layers[0 : use_layer](x)           # decoder layers over KV caches of context_len positions
    x = x + dequantize(rows) @ proj        # the PLE rows consumed at the model's use layer
    x = layers[use_layer : layers](x)
    logits = rms_norm(x) @ lm_head

on a CUDA GPU in ONE full CUDA graph, timed by synchronized calls on the host clock for both
placements (the flag path's timer).  The batch is ``round(max_batch x batch_fraction)``, ``max_batch``
from :func:`ple_bench.serving.capacity.capacity` with the GPU's total memory, the model's weights and
the placement's table term; the KV caches (random, never zero) are allocated for that batch, so they
fill the memory the rule gives, as a server's would.  Before anything is timed the looked-up rows are
checked byte for byte against the table's synthetic rows (output buffers poisoned first) and the
logits against the same model run eagerly on the reference rows.

It reuses :class:`ple_bench.run.step.DecodeStep` (the flag path's posting after the launch, the
graphs, the id buffers, the consumer): :class:`ServeStep` is a decode step whose compute is the
first ``use_layer`` layers and whose consumer is followed by the rest of the model.

On a CPU (functional mode) the step runs eagerly, the ``tiny`` model against
:data:`FUNCTIONAL_HBM_BYTES` of pretend HBM, so that the functional run is fast."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..compute import DecoderCompute
from ..serving.capacity import Capacity, batch_at, served_capacity
from ..serving.models import ModelPreset, get_model
from .step import DecodeStep, StepMismatch, reference_rows, default_act_dtype

#: pretend HBM of a functional (CPU) run: the tiny model fits a few sequences in it
FUNCTIONAL_HBM_BYTES = 2 << 20


def placement_of(backend_cls: type) -> str:
    """``hbm`` for a table in device memory, ``host`` for a pinned host table whose path posts the
    step's host ids after the launch (the flag path); ``NotImplementedError`` for other paths."""
    if not backend_cls.table_in_host_memory:
        return "hbm"
    if backend_cls.posts_ids:
        return "host"
    raise NotImplementedError(f"{backend_cls.__name__}: a served step's host placement is the posted flag path "
                              "(a backend that declares posts_ids); this path posts nothing")


def hbm_total_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return FUNCTIONAL_HBM_BYTES


def serve_capacity(case, placement: str, device: torch.device) -> Capacity:
    """The capacity rule for ``case`` on ``device`` (:func:`ple_bench.serving.capacity.served_capacity`):
    its total memory (pretend HBM on a CPU) and its activation dtype's element size."""
    element = torch.empty((), dtype=default_act_dtype(device)).element_size()
    return served_capacity(get_model(case.model), placement=placement, context_len=case.context_len,
                           kv_dtype=case.kv_dtype, hbm_bytes=hbm_total_bytes(device), table_bytes=case.table_bytes,
                           heads=case.num_heads, dim=case.dim, row_bytes=case.row_bytes, element_bytes=element,
                           etp=case.etp, gpu_memory_utilization=case.gpu_memory_utilization)


def capacity_fields(cap: Capacity, placement: str, batch: int) -> dict[str, Any]:
    """The record fields the capacity rule gives before anything runs (a skipped case carries them)."""
    return {"placement": placement, "max_batch": cap.max_batch, "serve_batch": batch, "capacity_rule": cap.explain(),
            "hbm_bytes_total": cap.hbm_bytes}


serve_batch = batch_at  # the batch of a served case (one definition, in serving.capacity)


class ServeStep(DecodeStep):
    """The whole model's decode step around ``backend``'s lookup (see the module doc).  ``model``:
    a preset; ``batch``: sequences (= tokens) in the step.  Output: :attr:`logits`."""

    def __init__(self, backend, *, model: ModelPreset, batch: int, context_len: int, placement: str,
                 graph: str, device: torch.device, seed: int = 0) -> None:
        self.model = model
        self.placement = placement
        super().__init__(backend, hidden=model.hidden, num_tokens=batch, prefetch=placement == "host",
                         graph=graph, device=device, ids_on="host" if placement == "host" else "device",
                         compute="decoder", decoder_shape=model.name, decoder_layers=model.use_layer,
                         context_len=context_len, seed=seed)
        dev, act = self.device, self.act_dtype
        rest = model.layers - model.use_layer
        self.tail = (DecoderCompute(model.name, layers=rest, context_len=context_len, batch=batch, device=dev,
                                    dtype=act, seed=seed + 1) if rest else None)
        gen = torch.Generator(device=dev)
        gen.manual_seed(0x5E4E + seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, device=dev, dtype=act).mul_(rows ** -0.5)
            return w.masked_fill_(w == 0, rows ** -0.5)

        self.embed = weight(model.vocab, model.hidden)
        self.lm_head = weight(model.hidden, model.vocab)
        self.final_norm = torch.randn(model.hidden, generator=gen, device=dev, dtype=act).mul_(0.1).add_(1.0)
        self.tokens = torch.randint(0, model.vocab, (batch,), generator=gen, device=dev)
        self.logits = torch.empty(batch, model.vocab, dtype=act, device=dev)

    # ------------------------------------------------------------ bytes
    @property
    def weight_bytes(self) -> int:
        """Every weight allocated: the layers, embedding, final norm, LM head, the PLE projection."""
        tensors = [self.embed, self.lm_head, self.final_norm, self.proj]
        tensors += [w for dec in (self.decoder, self.tail) if dec is not None for layer in dec.layers
                    for w in layer.weights()]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def kv_bytes(self) -> int:
        return sum(dec.kv_bytes for dec in (self.decoder, self.tail) if dec is not None)

    # ------------------------------------------------------------ pieces
    def compute(self, n: int | None = None) -> torch.Tensor:
        """The token embedding and the layers before the use layer."""
        torch.index_select(self.embed, 0, self.tokens, out=self.hidden_in)
        return self.decoder(self.hidden_in)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The layers after the use layer, the final norm, the LM head (into :attr:`logits`)."""
        if self.tail is not None:
            x = self.tail(x)
        h = F.rms_norm(x, (self.model.hidden,), self.final_norm, self.shape_eps)
        return torch.mm(h, self.lm_head, out=self.logits)

    @property
    def shape_eps(self) -> float:
        return self.decoder.shape.eps

    # ------------------------------------------------------------ bodies
    def body_step(self) -> torch.Tensor:
        """The lookup issued at the step's start, consumed after ``use_layer`` layers."""
        if self.prefetch:
            self._start(self.ids, self._counts_arg)
        else:
            self._lookup(self.rows)
        x = self.compute()
        if self.prefetch:
            self._finalize(out=self.rows)
        return self.finish(self.consume(x, self.rows))

    def body_compute(self) -> torch.Tensor:
        """The step without its lookup (the rows already in :attr:`rows`)."""
        return self.finish(self.consume(self.compute(), self.rows))

    def close(self) -> None:
        super().close()
        if self.tail is not None:
            self.tail.close()
        self.tail = None
        self.embed = self.lm_head = self.logits = self.proj = torch.empty(0)


def check_serve(step: ServeStep, id_sets: Sequence[torch.Tensor], table_seed: int | None) -> None:
    """Each id set through the step (rows and logits poisoned first): the rows byte for byte against
    the table's synthetic rows, the logits against the model run eagerly on the reference rows.
    :class:`StepMismatch` on any difference."""
    run = step.runner("step")
    tol = 1e-4 if step.act_dtype == torch.float32 else 3e-2
    for i, ids in enumerate(id_sets):
        step.set_inputs(ids)
        step.rows.view(torch.uint8).fill_(0x7F)
        step.logits.fill_(float("nan"))
        buffer = step.backend.prefetch_buffer
        if buffer is not None:
            buffer.view(torch.uint8).fill_(0x7F)
        step._sync()
        run()
        step._sync()
        step.backend.check_deferred_errors()
        ref = reference_rows(step, ids, table_seed, None).to(step.rows.device)
        got, want = step.rows.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8)
        if got.shape != want.shape or bool((got != want).any()):
            bad = int((got != want).sum()) if got.shape == want.shape else got.numel()
            raise StepMismatch(f"served step ({step.placement}), id set {i}: {bad} of {got.numel()} row bytes "
                               "differ from the table's rows")
        out = step.logits.float().clone()
        emb = step.backend.dequantize(ref, step.act_dtype).to(step.act_dtype)
        expected = step.finish(torch.addmm(step.compute(), emb, step.proj)).float()
        err = (out - expected).abs().max().item()
        scale = max(expected.abs().max().item(), 1.0)
        if not err == err or err > tol * scale:  # NaN: the poison survived
            raise StepMismatch(f"served step ({step.placement}), id set {i}: logits differ from the eager model "
                               f"on the reference rows by {err:.4g} (tolerance {tol * scale:.4g})")


def run_serve_case(case, backend, id_sets: Sequence[torch.Tensor], policy, device: torch.device, *,
                   cap: Capacity, batch: int, placement: str, table_seed: int | None,
                   measure_fn: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Build the served step at ``batch``, check it, time it (the step, then the step without its
    lookup), free it; the record's serve fields."""
    if measure_fn is None:
        from ..measure import measure as measure_fn  # noqa: N813  (the measure layer's entry, as step.py)
    device = torch.device(device)
    graph = "full" if device.type == "cuda" else "eager"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = ServeStep(backend, model=get_model(case.model), batch=batch, context_len=case.context_len,
                     placement=placement, graph=graph, device=device, seed=case.seed)
    try:
        check_serve(step, id_sets, table_seed)
        turn = [0]

        def timed(runner: Callable[[], Any]) -> Callable[[], None]:
            def fn() -> None:
                step.set_inputs(id_sets[turn[0] % len(id_sets)])
                turn[0] += 1
                runner()
            return fn

        kw = {"host_sync": True} if device.type == "cuda" else {}
        step_m = measure_fn(timed(step.runner("step")), device=device, policy=policy, cold_l2=False,
                            label="serve_step", **kw)
        compute_m = measure_fn(timed(step.runner("compute")), device=device, policy=policy, cold_l2=False,
                               label="serve_compute", **kw)
        stats = step_m.stats()
        rec: dict[str, Any] = {k: stats[k] for k in (
            "median_ms", "mean_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "iqr_ms", "cv", "noise", "n_samples",
            "throttled_samples", "dropped_samples", "sm_clock_mhz") if k in stats}
        step_ms, compute_ms = stats["median_ms"], compute_m.stats()["median_ms"]
        unstable = [label for label, m in (("serve_step", step_m), ("serve_compute", compute_m))
                    if getattr(m, "unstable", False)]
        rec.update(
            step_ms=step_ms, step_samples_ms=list(step_m.samples_ms), samples_ms=list(step_m.samples_ms),
            samples_throttled=list(step_m.throttled), compute_ms=compute_ms,
            compute_samples_ms=list(compute_m.samples_ms), exposed_ms=step_ms - compute_ms,
            timer=getattr(step_m, "timer", "host_sync" if device.type == "cuda" else "host_monotonic"),
            stopped_by=getattr(step_m, "stopped_by", None), unstable=bool(unstable),
            unstable_measurements=unstable or None,
            num_tokens=batch, kv_bytes=step.kv_bytes, weight_bytes=step.weight_bytes, kv_source="measured",
            graph=graph, prefetch=step.prefetch, ids_on=step.ids_on,
            hbm_bytes_used=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
        )
        rec.update(capacity_fields(cap, placement, batch))
        return rec
    finally:
        step.close()
        del step
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
