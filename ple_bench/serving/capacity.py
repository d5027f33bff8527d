"""The capacity rule, once: the largest batch of sequences a table placement leaves HBM for.

    budget = hbm_bytes x gpu_memory_utilization          (as serving engines; the rest is the CUDA
                                                          context, workspaces, graph pools)
    largest b with  budget - weights - table term - activations(b)  >=  b x KV bytes per sequence

The table term is the table's bytes over ETP ranks when it is resident (``placement = "hbm"``), the
device-side staging buffers when it lives in pinned host memory (``"host"``).  activations(b) =
b x activation bytes per sequence (:meth:`ModelPreset.activation_bytes_per_seq` unless given), so the
rule has a closed form.  A placement that fits no sequence has ``max_batch = 0`` and a ``reason`` with
the numbers (:meth:`Capacity.explain`)."""

from __future__ import annotations

from dataclasses import dataclass

from .models import ModelPreset, get_model

PLACEMENTS = ("hbm", "host")
GIB = float(1 << 30)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f}"


@dataclass(frozen=True)
class Capacity:
    """The rule's terms (bytes) and its answer."""

    model: str
    placement: str
    context_len: int
    kv_dtype: str
    hbm_bytes: int
    gpu_memory_utilization: float
    budget_bytes: int
    weight_bytes: int
    table_bytes: int
    table_term_bytes: int
    etp: int
    activation_bytes_per_seq: int
    activation_bytes: int
    kv_bytes_per_seq: int
    max_batch: int
    reason: str | None

    @property
    def kv_bytes(self) -> int:
        """The KV cache the largest batch allocates."""
        return self.max_batch * self.kv_bytes_per_seq

    def explain(self) -> str:
        """The rule with its terms in GiB, e.g. ``(139.8 GiB x 0.90 - 15.3 weights - 47.7 table - 0.4
        activations) / 1.13 GiB per sequence = 54``."""
        # GiB; MiB for a pretend GPU of less than 1 GiB (functional mode)
        big = self.hbm_bytes >= GIB
        b, unit = (_gib, "GiB") if big else (_mib, "MiB")
        if self.placement == "hbm":
            table = f"{b(self.table_term_bytes)} table" + (
                f" ({b(self.table_bytes)} / ETP {self.etp})" if self.etp > 1 else "")
        else:
            table = f"{b(self.table_term_bytes)} staging (table of {b(self.table_bytes)} in host memory)"
        per_seq = self.kv_bytes_per_seq / (GIB if big else 1 << 20)
        text = (f"{self.placement}: ({b(self.hbm_bytes)} {unit} × {self.gpu_memory_utilization:.2f} − "
                f"{b(self.weight_bytes)} weights − {table} − {b(self.activation_bytes)} activations) ÷ "
                f"{per_seq:.3g} {unit} per sequence ({self.model}, {self.context_len} tokens of "
                f"{self.kv_dtype} KV) = {self.max_batch}")
        return text if self.reason is None else f"{text}: {self.reason}"


def capacity(model: ModelPreset | str, *, placement: str, context_len: int, kv_dtype: str, hbm_bytes: int,
             table_bytes: int, staging_bytes: int = 0, etp: int = 1, gpu_memory_utilization: float = 0.90,
             activation_bytes_per_seq: int | None = None, weight_bytes: int | None = None,
             host_bytes: int | None = None) -> Capacity:
    """The largest batch ``placement`` fits (see the module doc).  ``weight_bytes``: measured weights
    (default: the preset's bf16 weights); ``host_bytes``: host memory, when known (a host table larger
    than it fits nothing)."""
    preset = get_model(model) if isinstance(model, str) else model
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; allowed: {', '.join(PLACEMENTS)}")
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    if etp < 1:
        raise ValueError(f"etp must be >= 1, got {etp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = int(hbm_bytes * gpu_memory_utilization)
    weights = preset.weight_bytes() if weight_bytes is None else int(weight_bytes)
    table_term = -(-table_bytes // etp) if placement == "hbm" else int(staging_bytes)
    act_per_seq = preset.activation_bytes_per_seq() if activation_bytes_per_seq is None \
        else int(activation_bytes_per_seq)
    kv_per_seq = preset.kv_bytes_per_seq(context_len, kv_dtype)
    room = budget - weights - table_term
    batch = max(0, room // (kv_per_seq + act_per_seq))
    reason = None
    if placement == "host" and host_bytes is not None and table_bytes > host_bytes:
        batch = 0
        reason = f"the {_gib(table_bytes)} GiB table is larger than the {_gib(host_bytes)} GiB of host memory"
    elif room <= 0:
        reason = (f"the model does not fit at batch 1: weights and {'table' if placement == 'hbm' else 'staging'} "
                  f"take {_gib(weights + table_term)} GiB of a {_gib(budget)} GiB budget")
    elif batch == 0:
        reason = (f"no sequence of {context_len} tokens fits: {_gib(room)} GiB left for KV, one sequence needs "
                  f"{kv_per_seq / GIB:.3g} GiB")
    return Capacity(model=preset.name, placement=placement, context_len=int(context_len), kv_dtype=kv_dtype,
                    hbm_bytes=int(hbm_bytes), gpu_memory_utilization=float(gpu_memory_utilization),
                    budget_bytes=budget, weight_bytes=weights, table_bytes=int(table_bytes),
                    table_term_bytes=table_term, etp=int(etp), activation_bytes_per_seq=act_per_seq,
                    activation_bytes=batch * act_per_seq, kv_bytes_per_seq=kv_per_seq, max_batch=int(batch),
                    reason=reason)


#: device copies of one step's rows a host placement keeps (the rows and their staging copy)
STAGING_COPIES = 2


def served_capacity(preset: ModelPreset, *, placement: str, context_len: int, kv_dtype: str, hbm_bytes: int,
                    table_bytes: int, heads: int, dim: int, row_bytes: int, element_bytes: int = 2, etp: int = 1,
                    gpu_memory_utilization: float = 0.90, host_bytes: int | None = None) -> Capacity:
    """The capacity rule as a served step applies it -- the one place, read by the serve executor
    (:func:`ple_bench.run.serve.serve_capacity`, with its device's memory and activation dtype) and by
    ``advise --model`` (any HBM): the model's weights at ``element_bytes`` plus the PLE projection
    (heads x dim x hidden), and the table (hbm) or :data:`STAGING_COPIES` copies of one step's rows at the
    batch the rule gives without them (host)."""
    weights = preset.weight_bytes(element_bytes) + heads * dim * preset.hidden * element_bytes
    kw = dict(placement=placement, context_len=context_len, kv_dtype=kv_dtype, hbm_bytes=hbm_bytes,
              table_bytes=table_bytes, etp=etp, gpu_memory_utilization=gpu_memory_utilization,
              weight_bytes=weights, host_bytes=host_bytes)
    if placement == "host":
        bound = capacity(preset, **kw).max_batch
        kw["staging_bytes"] = STAGING_COPIES * bound * heads * row_bytes
    return capacity(preset, **kw)


def batch_at(cap: Capacity, fraction: float) -> int:
    """The batch of a served case: ``round(max_batch x fraction)``, at least 1 where anything fits."""
    return max(1, round(cap.max_batch * fraction)) if cap.max_batch else 0
