"""Decoder models as data: :class:`ModelPreset` (layers, hidden, query / KV heads, head dim, FFN,
vocab, the layer after which the PLE rows are consumed) and :data:`MODELS`, the named presets (the
``model`` axis).  :data:`ple_bench.compute.DECODER_SHAPES` is built from these presets: one shape per
model, defined here once.

The byte counts are the ones a server allocates: :meth:`ModelPreset.weight_bytes` every layer's
QKV / output / gate+up / down projections and its norms, the embedding, the final norm and the (untied)
LM head; :meth:`ModelPreset.kv_bytes_per_token` K and V of every layer for one position."""

from __future__ import annotations

from dataclasses import dataclass

from ..units import DTYPE_BYTES

#: the ``kv_dtype`` axis' values (bytes per element in :data:`ple_bench.units.DTYPE_BYTES`)
KV_DTYPES = ("bf16", "fp8")


def layer_params(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> int:
    """Weights of one pre-norm decoder layer (as Qwen3): fused QKV, output projection, gate+up, down,
    the two RMSNorms and the per-head Q / K norms."""
    qkv_width = (heads + 2 * kv_heads) * head_dim
    return (hidden * qkv_width + heads * head_dim * hidden + hidden * 2 * ffn + ffn * hidden
            + 2 * hidden + 2 * head_dim)


def kv_dtype_bytes(kv_dtype: str) -> int:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; allowed: {', '.join(KV_DTYPES)}")
    return DTYPE_BYTES[kv_dtype]


@dataclass(frozen=True)
class ModelPreset:
    """A decoder-only model's shape.  ``use_layer``: the PLE rows are consumed after this many layers
    (as Engram: after layer 2); the lookup is issued at the step's start."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    use_layer: int = 2

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: {self.heads} query heads do not split over {self.kv_heads} KV heads")
        if not 1 <= self.use_layer <= self.layers:
            raise ValueError(f"{self.name}: use_layer {self.use_layer} outside 1..{self.layers}")

    @property
    def layer_params(self) -> int:
        return layer_params(self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn)

    @property
    def params(self) -> int:
        """Every weight: the layers, the embedding, the final norm, the LM head (untied)."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden + self.hidden

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.params * dtype_bytes

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V of every layer for one position: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes(kv_dtype)

    def kv_bytes_per_seq(self, context_len: int, kv_dtype: str) -> int:
        return context_len * self.kv_bytes_per_token(kv_dtype)

    def activation_bytes_per_seq(self, dtype_bytes: int = 2) -> int:
        """The decode step's live tensors per sequence at its widest point: the fp32 logits, the
        gate+up and QKV outputs, a few residual-stream vectors (a server's activation profile is of
        this order; the fixed workspaces sit in the memory ``gpu_memory_utilization`` leaves out)."""
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        return 4 * self.vocab + dtype_bytes * (2 * self.ffn + qkv_width + 4 * self.hidden)


#: the named presets (the ``model`` axis); the shapes are the models' config.json
MODELS: dict[str, ModelPreset] = {m.name: m for m in (
    # Qwen/Qwen3-8B: 36 layers, 8.19 B parameters (untied LM head)
    ModelPreset("qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936),
    # Qwen/Qwen3-32B: 64 layers, 32.8 B parameters
    ModelPreset("qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn=25600, vocab=151936),
    # the same structure, small enough for CPU functional mode and the CPU tests
    ModelPreset("tiny", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=512),
)}


def get_model(name: str) -> ModelPreset:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}") from None
