"""The decode step's main-stream compute kinds (the ``compute`` axis) and the
decoder layers of the ``decoder`` kind.

* ``matmul`` -- a chain of square ``[tokens, hidden] x [hidden, hidden]`` bf16
  matmuls over a weight ring larger than the L2, calibrated to take about
  ``compute_us`` (:class:`ple_bench.run.step.DecodeStep` builds it): compute-bound
  at decode batch sizes, a synthetic stand-in for "some layers".
* ``decoder`` -- :class:`DecoderCompute`: ``decoder_layers`` real decoder
  layers at a named open model's shape (:data:`DECODER_SHAPES`), one token per
  sequence of a batch of ``num_tokens`` sequences, each attending over a KV
  cache of ``context_len`` positions.  Like a real decode step it is
  memory-bound: every layer has its own weights and its own KV cache, so each
  step streams them all from HBM.  Its time is measured, not targeted
  (``compute_us`` does not apply to it).

One layer (pre-norm, as Qwen3)::

    h = rms_norm(x)                           # RMSNorm, weight per layer
    q, k, v = split(h @ W_qkv)                # fused QKV projection
    q, k = rms_norm(q), rms_norm(k)           # per-head QK-norm (Qwen3)
    q, k = rope(q), rope(k)                   # rotary at the step's position
    K[:, :, pos], V[:, :, pos] = k, v         # the new token into its cache slot
    a = sdpa(q, K, V, enable_gqa=True)        # attention over the context_len cache
    x = x + a @ W_o
    g, u = split(rms_norm(x) @ W_gate_up)     # SwiGLU MLP
    x = x + (silu(g) * u) @ W_down

Every sequence is at the same position ``pos = context_len - 1`` and writes its
new K/V into that one slot: the compute is a pure function of its input (the
step's reference output, :func:`ple_bench.run.step.check_step`, runs it again and
gets the same result), and it reads ``context_len`` positions of K and V per
sequence and layer.

Weights are random (normal, scaled by 1/sqrt(fan_in); norm weights around 1),
never zero (an exact zero is replaced), in the activation dtype (bf16 on a GPU,
float32 in CPU functional mode); the KV caches are random normal.
:attr:`DecoderCompute.bytes_read` is what one call reads from memory: every
weight once and the whole of every KV cache (the step adds its consumer's
projection, :meth:`ple_bench.run.step.DecodeStep.compute_record`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .serving.models import MODELS, layer_params
from .spec.case import COMPUTE_KINDS  # noqa: F401  (the kinds are an axis: defined with the case)


@dataclass(frozen=True)
class DecoderShape:
    """A decoder layer's shape: hidden size, query / KV heads of ``head_dim``, the
    SwiGLU MLP's intermediate size."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: {self.heads} query heads do not split over {self.kv_heads} KV heads")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: rotary needs an even head_dim, got {self.head_dim}")

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one layer: QKV, output projection, gate+up, down, the norms."""
        return layer_params(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate)

    def layer_weight_bytes(self, element_size: int) -> int:
        return self.layer_params * element_size

    def layer_kv_bytes(self, context_len: int, batch: int, element_size: int) -> int:
        """One layer's K and V caches: context_len x batch x kv_heads x head_dim, twice."""
        return 2 * context_len * batch * self.kv_heads * self.head_dim * element_size


#: named shapes (the ``decoder_shape`` axis): one layer of each model preset
#: (:data:`ple_bench.serving.models.MODELS`, where the shapes are defined)
DECODER_SHAPES: dict[str, DecoderShape] = {
    m.name: DecoderShape(m.name, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                         intermediate=m.ffn)
    for m in MODELS.values()
}


def decoder_shape(name: str) -> DecoderShape:
    try:
        return DECODER_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown decoder_shape {name!r}; allowed: {', '.join(DECODER_SHAPES)}") from None


def _nonzero(t: torch.Tensor, fill: float) -> torch.Tensor:
    return t.masked_fill_(t == 0, fill)


class DecoderLayer:
    """One layer's weights and KV cache (plain tensors; see the module doc)."""

    def __init__(self, shape: DecoderShape, *, context_len: int, batch: int, device: torch.device,
                 dtype: torch.dtype, gen: torch.Generator) -> None:
        d, hd, inter = shape.hidden, shape.head_dim, shape.intermediate

        def weight(rows: int, cols: int) -> torch.Tensor:
            scale = 1.0 / math.sqrt(rows)
            w = torch.randn(rows, cols, generator=gen, device=device, dtype=dtype).mul_(scale)
            return _nonzero(w, scale)

        def norm(n: int) -> torch.Tensor:
            w = torch.randn(n, generator=gen, device=device, dtype=dtype).mul_(0.1).add_(1.0)
            return _nonzero(w, 1.0)

        self.norm_in, self.norm_post = norm(d), norm(d)
        self.q_norm, self.k_norm = norm(hd), norm(hd)
        self.w_qkv = weight(d, shape.qkv_width)
        self.w_o = weight(shape.heads * hd, d)
        self.w_gate_up = weight(d, 2 * inter)
        self.w_down = weight(inter, d)
        cache = (batch, shape.kv_heads, context_len, hd)
        self.k_cache = torch.randn(cache, generator=gen, device=device, dtype=dtype)
        self.v_cache = torch.randn(cache, generator=gen, device=device, dtype=dtype)

    def weights(self) -> tuple[torch.Tensor, ...]:
        return (self.norm_in, self.norm_post, self.q_norm, self.k_norm, self.w_qkv, self.w_o,
                self.w_gate_up, self.w_down)


class DecoderCompute:
    """``layers`` decoder layers of ``shape`` on a batch of ``batch`` sequences of one
    token each, over KV caches of ``context_len`` positions (see the module doc).

    ``compute(x)`` (``[batch, hidden]``, the activation dtype) returns the residual
    stream after the last layer, in the static buffer :attr:`out`."""

    def __init__(self, shape: DecoderShape | str, *, layers: int, context_len: int, batch: int,
                 device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> None:
        self.shape = decoder_shape(shape) if isinstance(shape, str) else shape
        if layers < 1:
            raise ValueError(f"decoder_layers must be >= 1, got {layers}")
        if context_len < 1:
            raise ValueError(f"context_len must be >= 1, got {context_len}")
        if batch < 1:
            raise ValueError(f"the batch (num_tokens) must be >= 1, got {batch}")
        self.layers_count, self.context_len, self.batch = int(layers), int(context_len), int(batch)
        self.device, self.dtype = torch.device(device), dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self.weight_bytes = layers * self.shape.layer_weight_bytes(self.element_size)
        self.kv_bytes = layers * self.shape.layer_kv_bytes(context_len, batch, self.element_size)
        self._check_memory()
        gen = torch.Generator(device=self.device)
        gen.manual_seed(0xDEC0 + seed)
        self.layers = [DecoderLayer(self.shape, context_len=context_len, batch=batch, device=self.device,
                                    dtype=dtype, gen=gen) for _ in range(layers)]
        self.position = context_len - 1
        hd = self.shape.head_dim
        inv_freq = self.shape.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angle = self.position * inv_freq
        self._cos = torch.cat([angle.cos(), angle.cos()]).to(device=self.device, dtype=dtype)
        self._sin = torch.cat([angle.sin(), angle.sin()]).to(device=self.device, dtype=dtype)
        self.out = torch.empty(batch, self.shape.hidden, dtype=dtype, device=self.device)

    @property
    def bytes_read(self) -> int:
        """Bytes one call reads: every layer's weights and its whole K and V caches."""
        return self.weight_bytes + self.kv_bytes

    def _check_memory(self) -> None:
        """``NotImplementedError`` (-> the case is skipped) when the weights and caches
        cannot fit in the GPU's free memory (the caching allocator's free blocks count)."""
        if self.device.type != "cuda":
            return
        free, _ = torch.cuda.mem_get_info(self.device)
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        need = self.bytes_read + (1 << 30)  # activations, workspaces, the graphs' pools
        if need > free:
            raise NotImplementedError(
                f"decoder compute {self.shape.name} x {self.layers_count} layers, context {self.context_len} x "
                f"batch {self.batch}: needs {need / 1e9:.1f} GB of GPU memory (weights {self.weight_bytes / 1e9:.2f}"
                f" GB, KV caches {self.kv_bytes / 1e9:.2f} GB, 1 GiB of room), {free / 1e9:.1f} GB free")

    # ------------------------------------------------------------ the layers
    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * self._cos + rotated * self._sin

    def _layer(self, x: torch.Tensor, layer: DecoderLayer, out: torch.Tensor | None) -> torch.Tensor:
        s = self.shape
        b, hd, eps = self.batch, s.head_dim, s.eps
        h = F.rms_norm(x, (s.hidden,), layer.norm_in, eps)
        qkv = torch.mm(h, layer.w_qkv)
        q, k, v = qkv.split([s.heads * hd, s.kv_heads * hd, s.kv_heads * hd], dim=1)
        q = self._rope(F.rms_norm(q.reshape(b, s.heads, hd), (hd,), layer.q_norm, eps))
        k = self._rope(F.rms_norm(k.reshape(b, s.kv_heads, hd), (hd,), layer.k_norm, eps))
        layer.k_cache[:, :, self.position].copy_(k)
        layer.v_cache[:, :, self.position].copy_(v.reshape(b, s.kv_heads, hd))
        attn = F.scaled_dot_product_attention(q.unsqueeze(2), layer.k_cache, layer.v_cache, enable_gqa=True)
        x = torch.addmm(x, attn.reshape(b, s.heads * hd), layer.w_o)
        h = F.rms_norm(x, (s.hidden,), layer.norm_post, eps)
        gate, up = torch.mm(h, layer.w_gate_up).chunk(2, dim=1)
        act = F.silu(gate).mul_(up)
        if out is None:
            return torch.addmm(x, act, layer.w_down)
        return torch.addmm(x, act, layer.w_down, out=out)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """The layers on ``x``; the result is in :attr:`out` (returned)."""
        if tuple(x.shape) != (self.batch, self.shape.hidden):
            raise ValueError(f"decoder input must be {(self.batch, self.shape.hidden)}, got {tuple(x.shape)}")
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = self._layer(x, layer, self.out if i == last else None)
        return x

    __call__ = compute

    def close(self) -> None:
        """Drop the weights and caches now (GBs on a GPU), not at the next gc."""
        self.layers = []
