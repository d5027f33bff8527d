"""The record schema: every field a record of ``records.jsonl`` carries, with its
unit, the kinds of case that carry it, its definition, and the schema version.

One definition per field.  Derived figures (GB/s, rows/s, the binding ceiling and
the share of it, the overlap efficiency) are computed here, once, by
:func:`derive` -- the runner calls it before a record is written, and
:func:`upgrade` calls it on older records when a run is loaded.  Readers (the
report, the compare, the export) read the fields; they never recompute them.

``python -m ple_bench schema`` prints the table below as markdown (the README's
record section is that output; a test keeps them equal).

Schema versions:

* 1 -- records without ``schema_version`` (the first schema): every step
  record carried GB/s and a % of an H2D / D2D copy ceiling, ``overlap_efficiency``
  was ``clamp(1 - exposed / lookup, 0, 1)`` on every step, lookups were held against
  the H2D (host tables) or D2D (device tables) copy ceiling.
* 2 -- lookups held against the random-row gather ceiling of their memory at
  their row size (or the host-gather ceiling of host paths); steps carry no GB/s;
  ``overlap_efficiency`` only for prefetch steps, against the prefetch-off twin,
  not clamped.
* 3 -- this module: single-rank lookups held against the random-row ceiling of
  their own table, row size and id distribution, timed as they are
  (``random_row_ceiling``, ``random_row_ceiling_gbps``; meta.json
  ``ceilings.random_row``); the host-gather ceiling timed as host paths are
  (``host_sync``), its back-to-back figure beside it (``host_gather_ceiling_warm_ms``);
  ``ceiling_exceeded`` flags a lookup above :data:`CEILING_SLACK_PCT` of its ceiling.
  Version-2 records are upgraded by deriving the new flag (their ceilings stay
  the run-wide ones they were held against).
* 4 -- the host-gather ceiling is the faster of two plain gathers: torch's
  ``index_select`` and the native row loop that ``pinned_cpu_gather`` uses (on the H200
  hosts the loop alone took 72-89 % of index_select's time, so index_select did not bound
  the path); ``host_gather_ceiling_gather`` names the binding one.
  Version-3 records are upgraded with ``host_gather_ceiling_gather = "index_select"``
  where they carry a host-gather ceiling (what they were held against).
* 5 -- ``offload_overhead`` is derived here from the run's records (:class:`Peers`), against
  the resident step a server would run instead: ids on the device, the same workload
  (:func:`baseline_key`: table, shape, heads, tokens, compute, id distribution, seed,
  topology), its fastest graph mode and prefetch setting (a full graph where captured), on
  the pinned step's own timer; ``offload_baseline*`` name it; ``offload_overhead_same_graph``
  holds the step against the resident step of its own graph mode and prefetch.  Resident
  steps carry none.
  Older records are upgraded by deriving these again; the stored figure (held against the
  last resident step measured with the same table, shape, tokens, compute, graph mode and
  ids placement) is kept as ``legacy_offload_overhead``.
* 6 -- as 5, but the baseline's prefetch setting is the resident path's own choice, as its
  graph mode is: the fastest resident step of the workload with or without prefetch (the
  like-for-like figure keeps the step's own).  Version-5 records (one run, 2026-12-01, whose
  baseline kept the pinned step's prefetch) are derived again.
* 7 -- repeated cases (a suite group's ``repeat``): ``processes``, ``rounds``, ``replicates`` (every
  round's figures and where its process ran), their figures the mean over processes, and
  ``ci_low_ms`` / ``ci_high_ms`` (and a served step's ``tokens_per_s_ci_low`` / ``_high``): the 95 %
  interval over processes (:mod:`ple_bench.uncertainty`).  Older records are derived again (they
  carry no replicates: no interval fields).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .impl_facts import facts_of
from .spec.case import Case, has_compute
from .uncertainty import interval, observations
from .units import DTYPE_BYTES

SCHEMA_VERSION = 7

#: a lookup above this share of its ceiling says the ceiling is wrong for it (it does not
#: bound what the lookup does), not that the lookup is fast
CEILING_SLACK_PCT = 105.0

KINDS = ("all", "lookup", "step", "serve")

#: per-sample lists of a float unit (``samples_ms``, ``rank_medians_ms``, ...)
_LIST_SUFFIXES = ("samples_ms", "rank_medians_ms")


#: the types a field can declare (:attr:`Field.type`): what a reader gets from a loaded record
#: (:func:`coerce`; None where not measured or not readable as one)
TYPES = ("float", "int", "bool", "str", "list[float]", "list[bool]", "list[str]", "list[dict]", "dict")
#: units whose figures are floats, and units that count whole things (ints)
FLOAT_UNITS = ("ms", "s", "%", "GB/s", "rows/s", "tokens/s", "MHz", "us")
INT_UNITS = ("B", "rows", "samples", "ranks", "SMs", "sequences")


@dataclass(frozen=True)
class Field:
    name: str
    unit: str  # "" when the field has none (text, flags, counts)
    kinds: str  # all | lookup | step | serve
    definition: str
    derived: bool = False  # computed by :func:`derive` from the other fields
    legacy: bool = False  # only on records upgraded from an older schema
    #: one of :data:`TYPES`; left out, it follows from the unit (a float unit: float, or a list of
    #: floats for a per-sample list; a counting unit: int; "bool"; "ISO 8601": str).  A field
    #: without a unit must declare it.
    type: str = ""

    def __post_init__(self) -> None:
        declared = self.type or _type_of_unit(self.name, self.unit)
        if declared not in TYPES:
            raise ValueError(f"record field {self.name!r}: declare its type (one of {', '.join(TYPES)}), "
                             f"not {declared!r}")
        object.__setattr__(self, "type", declared)


def _type_of_unit(name: str, unit: str) -> str:
    if unit in FLOAT_UNITS:
        return "list[float]" if name.endswith(_LIST_SUFFIXES) else "float"
    if unit in INT_UNITS:
        return "int"
    return {"bool": "bool", "ISO 8601": "str"}.get(unit, "")


def _f(name: str, unit: str, kinds: str, definition: str, **kw: Any) -> Field:
    return Field(name, unit, kinds, definition, **kw)


#: Fields every record has a key for (``None`` where not measured), in this order.
FIELDS: tuple[Field, ...] = (
    # identity and outcome
    _f("schema_version", "", "all", "the record schema version (this module's SCHEMA_VERSION when written)",
       type="int"),
    _f("case_id", "", "all", "the case's stable id (same case, same id, on every run)", type="str"),
    _f("status", "", "all", "ok | skipped | failed | invalid", type="str"),
    _f("reason", "", "all", "why the case was skipped, failed or is invalid ('' when ok)", type="str"),
    _f("mode", "", "all", "gpu | functional (CPU, host timer: not GPU performance)", type="str"),
    _f("timer", "", "all", "cuda_event | host_sync (synchronized calls on the host clock) | host_monotonic",
       type="str"),
    _f("world_size", "ranks", "all", "tp x dp: the ranks the case ran on"),
    _f("finished_at", "ISO 8601", "all", "when the case ended"),
    _f("duration_s", "s", "all", "wall time the case took, checks and measurements included"),
    _f("traceback", "", "all", "the traceback of a failed case", type="str"),
    _f("rank_outcomes", "", "all", "under torchrun, when ranks disagreed: each rank's status and reason",
       type="list[dict]"),
    # the summary of the primary measurement
    _f("median_ms", "ms", "all", "median of the kept samples (lookup: the lookup; step: the step, = step_ms)"),
    _f("mean_ms", "ms", "all", "mean of the kept samples"),
    _f("min_ms", "ms", "all", "fastest kept sample"),
    _f("max_ms", "ms", "all", "slowest kept sample"),
    _f("p10_ms", "ms", "all", "10th percentile of the kept samples"),
    _f("p90_ms", "ms", "all", "90th percentile of the kept samples"),
    _f("iqr_ms", "ms", "all", "interquartile range of the kept samples"),
    _f("cv", "", "all", "coefficient of variation (std / mean) of the kept samples", type="float"),
    _f("noise", "", "all", "the noise figure adaptive stopping used", type="float"),
    _f("n_samples", "samples", "all", "samples taken"),
    _f("samples_ms", "ms", "all", "every raw sample, in order (kept ones: results.kept_samples)"),
    _f("samples_throttled", "", "all", "one flag per sample: taken while the SM clock was throttled",
       type="list[bool]"),
    _f("throttled_samples", "samples", "all", "flagged samples (left out of the summary unless all are)"),
    _f("dropped_samples", "samples", "all", "samples the timer dropped"),
    _f("stopped_by", "", "all", "what ended sampling (noise target, time budget, sample cap)", type="str"),
    _f("unstable", "", "all",
       "the samples' first and second halves disagreed beyond their noise (measure.stats.halves_disagree) in "
       "the measurement and in its one re-measurement: the figure is not to be trusted (a step: any of its "
       "measurements, named in unstable_measurements)", type="bool"),
    _f("unstable_measurements", "", "step", "the step's measurements that were unstable (step, lookup, compute, ...)",
       type="list[str]"),
    _f("sm_clock_mhz", "MHz", "all", "median SM clock over the samples"),
    _f("event_samples_ms", "ms", "lookup", "host_sync timer: the CUDA events' time of the same calls"),
    _f("hot_median_ms", "ms", "lookup", "median with a warm L2 (the same lookup, no flush)"),
    _f("hot_samples_ms", "ms", "lookup", "raw warm-L2 samples"),
    _f("graph_median_ms", "ms", "lookup", "median of a CUDA-graph replay of the lookup alone"),
    _f("graph_samples_ms", "ms", "lookup", "raw graph-replay samples"),
    _f("graph_id_sets", "", "lookup", "id sets the graph replay rotated through, one captured graph per set "
                                       "(1 in records before schema 2: one repeated set)", type="int"),
    _f("graph_cold_l2", "bool", "lookup", "the L2 was flushed before every graph-replay sample, as for median_ms"),
    _f("cold_l2", "bool", "lookup", "the L2 was flushed before every sample of the primary measurement"),
    _f("id_sets", "", "lookup", "independent id sets the lookup rotated through", type="int"),
    # what is moved
    _f("rows", "rows", "all", "rows looked up per call (tokens x heads, this rank)"),
    _f("row_bytes", "B", "all", "bytes per stored row (dim x element size)"),
    _f("table_bytes", "B", "all", "bytes of the whole table (vocab_size x row_bytes)"),
    _f("bytes_moved", "B", "all", "rows x row_bytes: the bytes the lookup reads (rows read, not written)"),
    # derived: rates and the binding ceiling (lookups only)
    _f("gbps", "GB/s", "lookup", "rows x row_bytes / median_ms (reads only, 1e9 B/s); None on steps",
       derived=True),
    _f("rows_per_s", "rows/s", "lookup", "rows / median_ms; None on steps", derived=True),
    _f("ceiling", "", "lookup",
       "the ceiling the lookup is held against: its own random-row ceiling at its own row count where "
       "measured (<memory>_random_row_at_rows: the latency floor of that batch; entry "
       "random_row_ceiling_at_rows), else its random-row ceiling at a bandwidth-bound batch "
       "(<memory>_random_row, memory device | pinned | host; entry random_row_ceiling), else for "
       "records without one device-resident tables device_random_row_gbps_<N>B, pinned kernel paths "
       "pinned_random_row_gbps_<N>B (N: the row size, else the nearest measured), functional mode "
       "host_memcpy_gbps; host-gather paths host_gather; copy-engine paths h2d_gbps (one contiguous "
       "host->device copy of as many bytes: what copy engines can move); None on steps", derived=True, type="str"),
    _f("ceiling_gbps", "GB/s", "lookup",
       "that ceiling in GB/s, bytes counted as the lookup's: rows x row_bytes (random_row: "
       "random_row_ceiling_gbps; host_gather: bytes_moved / host_gather_ceiling_ms)", derived=True),
    _f("ceiling_row_bytes", "B", "lookup",
       "the row size the ceiling was measured at (differs from row_bytes when not measured there)",
       derived=True),
    _f("pct_of_ceiling", "%", "lookup",
       "100 x gbps / ceiling_gbps (host_gather: = pct_of_host_gather_ceiling); above 105 the ceiling is wrong "
       "for that case", derived=True),
    _f("ceiling_exceeded", "bool", "lookup",
       "pct_of_ceiling > 105: the ceiling does not bind this lookup (the ceiling is wrong for it, the lookup "
       "is not faster than the hardware); None without a share", derived=True),
    _f("random_row_ceiling", "", "lookup",
       "single-rank lookups of kernel paths: the key of this case's random-row ceiling in meta.json "
       "ceilings.random_row (<memory>:<table bytes>:<row bytes>:<ids>:h<heads>:n<rows>[:<host_alloc>]): "
       "torch.index_select of rows of the case's id distribution from the tensor its kernel reads, timed as the case (same "
       "timer, L2 flushing, rotating id sets)", type="str"),
    _f("random_row_ceiling_gbps", "GB/s", "lookup", "that ceiling: its rows x row bytes / its median time"),
    _f("random_row_ceiling_at_rows", "", "lookup",
       "the key of the same random-row ceiling at the lookup's own row count (rounded up to whole tokens): "
       "the plain gather of that batch, its latency floor where the batch is small", type="str"),
    _f("random_row_ceiling_at_rows_gbps", "GB/s", "lookup", "that ceiling's GB/s"),
    _f("pct_of_bandwidth_ceiling", "%", "lookup",
       "100 x gbps / random_row_ceiling_gbps: the share of the bandwidth-bound gather rate (low for a "
       "latency-bound batch, where pct_of_ceiling holds it against its own batch)", derived=True),
    _f("lookup_mechanism", "", "all",
       "how the path moves its rows (from its declared capabilities): kernel (reads the table on the GPU), "
       "host_gather (the host's cores gather: gathers_on_host), host_copy (copy engines, ids read on the host)",
          type="str"),
    _f("kernel_ran", "", "all",
       "the lookup kernel the backend ran (its kernel_name: the case's kernel, or the backend's default, "
       "which may differ by device, when the case names none); None where no GPU kernel gathers the rows "
       "(host_gather, host_copy) and in runs before 2026-12-02, whose device default was torch_masked", type="str"),
    _f("table_in_host_memory", "", "all",
       "the backend declares its table in host memory (capability table_in_host_memory); None: unknown, "
       "then impl 'device' is device-resident and every other impl is not", type="bool"),
    # host paths
    _f("host_gather_ceiling_ms", "ms", "all",
       "host paths: the faster of two plain gathers of as many uniform random rows of this table into "
       "pinned staging (torch.index_select; the native row loop pinned_cpu_gather uses, called alone), "
       "each plus one host->device copy, timed as host paths are (host_sync, the lookups' L2 setting; "
       "meta.json ceilings.host_gather keeps both medians; schema 3: index_select only)"),
    _f("host_gather_ceiling_gather", "", "all",
       "the plain gather that binds host_gather_ceiling_ms: index_select | row_loop", type="str"),
    _f("host_gather_ceiling_rows_per_s", "rows/s", "all", "rows / host_gather_ceiling_ms"),
    _f("host_gather_ceiling_warm_ms", "ms", "all",
       "the same gather back to back, warm L2, host clock around synchronized calls (the figure before "
       "schema 3)"),
    _f("pct_of_host_gather_ceiling", "%", "lookup", "100 x host_gather_ceiling_ms / median_ms"),
    _f("lookup_pct_of_host_gather_ceiling", "%", "step", "100 x host_gather_ceiling_ms / lookup_ms"),
    _f("host_thread_ms", "ms", "all", "CPU time of the path's own host threads per lookup"),
    _f("cache_hit_rate", "", "all", "hot-row cache: share of rows served from the GPU cache (0..1)", type="float"),
    _f("unique_rows_fraction", "", "all",
       "distinct rows / rows of one batch of the ids looked up, the median over the case's id sets "
       "(1 for uniform ids over a large table; lower where n-grams or hot rows repeat)", type="float"),
    _f("ids_trace", "", "all",
       "ids text:<corpus>: the trace's text, size, tokens of its measured and warm-up regions and "
       "tokenizer (ple_bench/traces.py)", type="str"),
    _f("gather_impl", "", "all",
       "pinned_cpu_gather: the code that ran its gather and copy -- native (one C++ call: "
       "backends/cuda/native/host_gather.cpp), python (the same steps from Python: no compiler or ninja, "
       "or PLE_BENCH_NATIVE=0), general (the ETP / DP / threaded path)", type="str"),
    # multi-rank
    _f("gather_ms", "ms", "lookup", "all-gather of the DP ranks' ids"),
    _f("gather_bytes", "B", "lookup", "bytes the id all-gather moves"),
    _f("reduce_ms", "ms", "lookup", "all-reduce of the ETP shards' rows"),
    _f("reduce_bytes", "B", "lookup", "bytes the all-reduce reduces"),
    _f("reduce_busbw_gbps", "GB/s", "lookup", "2 (n-1)/n x reduce_bytes / reduce_ms (nccl-tests' bus bandwidth)"),
    _f("rank_medians_ms", "ms", "all", "every rank's median"),
    _f("rank_spread_ms", "ms", "all", "slowest - fastest rank median"),
    _f("slowest_rank", "", "all", "the rank whose samples the record holds", type="int"),
    _f("sm_limit_granted", "SMs", "all", "sm_limit > 0: SMs the driver gave the side stream's green context"),
    _f("green_via", "", "all", "sm_limit > 0: how the green context was made", type="str"),
    _f("background_h2d_gbps", "GB/s", "step", "h2d_background: the rate the background host→device copy "
       "achieved beside the step's measurements (the link's share the step did not have)"),
    # a repeated case (a suite group's repeat = {processes, rounds}: ple_bench.run.replicate)
    _f("processes", "", "all", "a repeated case: the fresh worker processes it was measured in (its figures are "
       "the mean over them of each process's mean over its rounds)", type="int"),
    _f("rounds", "", "all", "a repeated case: the rounds measured in each process", type="int"),
    _f("replicates", "", "all", "a repeated case: every round, {process, round, position (in the round's random "
       "order), status, ms (figure -> the round's median), se_ms (figure -> its standard error), where the process "
       "ran (cpu, thread_cpus, cpus_allowed, cpu_khz, anon_huge_bytes, pid) and its state (sm_clock_mhz, "
       "compute_matmuls, table_alloc_s, ...)}", type="list[dict]"),
    _f("ci_low_ms", "ms", "all", "a repeated case: the 95 % interval's low end of its figure (step_ms, or median_ms "
       "of a lookup): hierarchical bootstrap over processes, rounds and samples (ple_bench.uncertainty)",
       derived=True),
    _f("ci_high_ms", "ms", "all", "a repeated case: the same interval's high end", derived=True),
    # decode steps
    _f("step_ms", "ms", "step", "the step in the case's graph mode (= median_ms)"),
    _f("step_samples_ms", "ms", "step", "raw step samples"),
    _f("step_event_samples_ms", "ms", "step", "host_sync timer: the CUDA events' time of the same steps"),
    _f("lookup_ms", "ms", "step", "the lookup alone (start_prefetch + finalize, or lookup)"),
    _f("lookup_samples_ms", "ms", "step", "raw lookup-alone samples"),
    _f("compute_ms", "ms", "step", "the step without its lookup (compute + consumer)"),
    _f("compute_samples_ms", "ms", "step", "raw compute-alone samples"),
    _f("compute_in_step_ms", "ms", "step", "the compute region inside the step (events around the matmuls)"),
    _f("compute_in_step_samples_ms", "ms", "step", "raw in-step compute-region samples"),
    _f("compute_region_alone_ms", "ms", "step", "the compute region without a lookup"),
    _f("compute_region_alone_samples_ms", "ms", "step", "raw compute-region-alone samples"),
    _f("compute_region_graph", "", "step",
       "the graph mode the compute regions were timed in: the case's own where its events can be recorded "
       "there (eager, breakable), else eager (a full-graph case)", type="str"),
    _f("exposed_ms", "ms", "step", "step_ms - compute_ms: the lookup time the compute did not hide"),
    _f("overlap_efficiency", "", "step",
       "prefetch steps only: 1 - exposed_ms / exposed_ms of overlap_twin (the same step, prefetch off); not "
       "clamped: negative when the prefetch makes the step slower; None without a twin or off prefetch",
       derived=True, type="float"),
    _f("overlap_twin", "", "step", "the case_id of the prefetch-off twin overlap_efficiency is measured against",
       derived=True, type="str"),
    _f("compute_slowdown", "", "step",
       "compute_in_step_ms / compute_region_alone_ms - 1 (how much the side-stream lookup slows the compute "
       "beside it), both timed in compute_region_graph; None without compute (compute matmul with compute_us = 0), "
       "and None for a host path's eager step "
       "(compute_slowdown_note says why: its compute is launched by the thread that does the lookup)",
       derived=True, type="float"),
    _f("compute_slowdown_note", "", "step",
       "why compute_slowdown is not given for this step (a host path's eager compute), else None", type="str"),
    _f("offload_overhead", "", "step",
       "pinned steps: step_ms / offload_baseline_ms - 1, against the resident step a server would run instead "
       "(see offload_baseline); None for resident steps, and where the run has no such step "
       "(offload_baseline_note says why)", derived=True, type="float"),
    _f("offload_baseline", "", "step",
       "the case_id of that resident step: impl device, ids on the device, the same table, shape, heads, tokens, "
       "compute, id distribution, seed and topology, in its fastest graph mode and prefetch setting measured (a "
       "full graph where it was captured; a resident lookup on a side stream is slower on the H200), on this "
       "step's timer", derived=True, type="str"),
    _f("offload_baseline_ms", "ms", "step", "the baseline's step time on this step's timer", derived=True),
    _f("offload_baseline_graph", "", "step", "the graph mode of the baseline figure (eager, breakable, full)",
       derived=True, type="str"),
    _f("offload_baseline_timer", "", "step", "the timer of both steps of offload_overhead", derived=True, type="str"),
    _f("offload_baseline_note", "", "step", "why offload_overhead is None for a pinned step", derived=True, type="str"),
    _f("offload_overhead_same_graph", "", "step",
       "step_ms / offload_baseline_same_graph_ms - 1: against the resident step in this step's own graph mode "
       "and prefetch setting (same rule otherwise), so the cost of the graph mode shows apart from the cost of "
       "the table's place", derived=True, type="float"),
    _f("offload_baseline_same_graph", "", "step", "the case_id of that same-graph resident step", derived=True,
       type="str"),
    _f("offload_baseline_same_graph_ms", "ms", "step", "its step time on this step's timer", derived=True),
    _f("step_host_sync_ms", "ms", "step", "resident steps: the same step on the host-sync timer"),
    _f("step_host_sync_samples_ms", "ms", "step", "raw host-sync samples of it"),
    _f("graph_break_cost_ms", "ms", "step", "breakable step - full-graph step (one rank, where capturable)"),
    _f("graph_break_cost_note", "", "step", "why the full-graph step could not be measured", type="str"),
    _f("full_step_ms", "ms", "step", "the step as one full CUDA graph"),
    _f("full_step_samples_ms", "ms", "step", "raw full-graph step samples"),
    _f("full_step_host_sync_ms", "ms", "step",
       "resident breakable steps: the full-graph step on the host-sync timer (the baseline of host-timed steps)"),
    _f("full_step_host_sync_samples_ms", "ms", "step", "raw host-sync samples of it"),
    _f("compute_matmuls", "", "step", "chained matmuls of the compute", type="int"),
    _f("compute_target_us", "us", "step", "the compute the calibration aimed at (compute_us)"),
    _f("matmul_us", "us", "step", "one matmul, calibrated"),
    _f("compute_bytes", "B", "step",
       "bytes the step without its lookup reads per call: compute decoder, every layer's weights and whole K "
       "and V caches (decoder_layers x (weights + 2 x context_len x num_tokens x kv_heads x head_dim x element "
       "size)); compute matmul, compute_matmuls x hidden^2 x element size (its weight ring exceeds the L2 from "
       "hidden 2048 on a GPU); both plus the consumer's projection (heads x dim x hidden)"),
    _f("compute_kv_bytes", "B", "step", "the KV-cache part of compute_bytes (0 for the matmul chain)"),
    _f("compute_hbm_gbps", "GB/s", "step",
       "compute_bytes / compute_ms (1e9 B/s): the memory bandwidth of the step without its lookup, in the "
       "case's graph mode", derived=True),
    _f("compute_pct_of_d2d", "%", "step",
       "100 x compute_hbm_gbps / meta.json ceilings.d2d_gbps (a device copy, read + write bytes); a step that "
       "only reads can pass 100 %: how memory-bound it is is compute_pct_of_hbm_read; None in functional mode "
       "or without the ceiling", derived=True),
    _f("compute_pct_of_hbm_read", "%", "step",
       "100 x compute_hbm_gbps / meta.json ceilings.hbm_read_gbps (reading device memory, writing nothing, bytes "
       "read, measured in the same run): how memory-bound the compute is (compute_bytes are the bytes it reads); "
       "None in functional mode or where the run has no read ceiling (runs before 2026-12-02)", derived=True),
    # the served step (kind = "serve": ple_bench.run.serve); it also carries step_ms, compute_ms, exposed_ms
    _f("placement", "", "serve", "where the table is: hbm (in GPU memory, the one-kernel gather, ids on the device) | "
       "host (pinned host memory, the posted flag path, ids on the host)", type="str"),
    _f("serve_batch", "sequences", "serve", "sequences in the step (one token each: = tokens per step) = "
       "round(max_batch x batch_fraction)"),
    _f("max_batch", "sequences", "serve", "the capacity rule's largest batch for the placement "
       "(ple_bench.serving.capacity: (HBM x gpu_memory_utilization - weights - table term - activations) / KV "
       "bytes per sequence); skipped serve cases carry it too, with placement, serve_batch and capacity_rule"),
    _f("capacity_rule", "", "serve", "the capacity rule with its terms in GiB (Capacity.explain())", type="str"),
    _f("hbm_bytes_total", "B", "serve", "the GPU memory the rule starts from (torch's total_memory; a pretend "
       "size in functional mode)"),
    _f("weight_bytes", "B", "serve", "the model's weights allocated (layers, embedding, final norm, LM head, the "
       "PLE projection)"),
    _f("kv_bytes", "B", "serve", "the KV caches allocated for the batch (every layer's K and V, serve_batch x "
       "context_len positions)"),
    _f("kv_source", "", "serve", "measured (the step ran over a KV cache of kv_dtype) | predicted (a skipped case "
       "with the capacity rule's batch only: no kernel reads that KV dtype)", type="str"),
    _f("hbm_bytes_used", "B", "serve", "torch's max allocated GPU memory during the case (table, weights, KV, "
       "activations; None in functional mode)"),
    _f("tokens_per_s", "tokens/s", "serve", "serve_batch / step_ms: tokens the batch decodes per second",
       derived=True),
    _f("tpot_ms", "ms", "serve", "time per output token of each sequence = step_ms (one token per sequence per "
       "step)", derived=True),
    _f("tokens_per_s_ci_low", "tokens/s", "serve", "a repeated case: serve_batch / ci_high_ms (the 95 % interval "
       "of tokens_per_s over processes)", derived=True),
    _f("tokens_per_s_ci_high", "tokens/s", "serve", "a repeated case: serve_batch / ci_low_ms", derived=True),
    # a table in host memory (every case of a backend whose table is in host memory)
    _f("pinned_bytes", "B", "all", "bytes page-locked for this rank's shard (0 in functional mode)"),
    _f("host_table_bytes", "B", "all", "host bytes the allocation reserves"),
    _f("table_alloc_s", "s", "all", "to allocate and pin the shard"),
    _f("table_fill_s", "s", "all", "to fill the shard with its synthetic rows and check it"),
    _f("host_mem_free_before_bytes", "B", "all", "MemAvailable before the table was allocated"),
    _f("host_mem_free_after_bytes", "B", "all", "MemAvailable after it was filled"),
    _f("host_alloc_from_cache", "", "all", "torch mode on a GPU: the block came from torch's pinned cache",
       type="bool"),
    _f("host_alloc_note", "", "all", "how the memory was allocated, in words", type="str"),
    _f("table_reused", "", "all", "the case ran on a table an earlier case allocated and filled (of its own "
       "path, or handed over by another path on the same rows); the allocation fields are that table's", type="bool"),
    # upgrades
    _f("upgraded_from", "", "all", "the schema version the stored record had, when older (None: written as is)",
       type="int"),
    _f("missing_fields", "", "all", "an upgraded record: the fields of its kind it lacks (not measured then)",
       type="list[str]"),
    _f("pct_of_random_row_ceiling", "%", "lookup",
       "legacy (version 1): 100 x gbps / the best random-row ceiling", legacy=True),
    _f("legacy_offload_overhead", "", "step",
       "legacy (version <= 4): offload_overhead as stored, against the resident step the run's executor had "
       "last measured with the same table, shape, tokens, compute, graph mode and ids placement (not the id "
       "distribution, prefetch, nor ids on the device)", legacy=True, type="float"),
    _f("legacy_overlap_efficiency", "", "step",
       "legacy (version 1): clamp(1 - exposed_ms / lookup_ms, 0, 1), as stored", legacy=True, type="float"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
#: every record has a key for each of these (``None`` where not measured)
RECORD_KEYS: tuple[str, ...] = tuple(f.name for f in FIELDS if not f.legacy)
DERIVED_KEYS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.derived)
HOST_ALLOC_KEYS: tuple[str, ...] = (
    "pinned_bytes", "host_table_bytes", "table_alloc_s", "table_fill_s", "host_mem_free_before_bytes",
    "host_mem_free_after_bytes", "host_alloc_from_cache", "host_alloc_note", "table_reused",
)
#: case fields the prefetch-off twin may differ in (settings of the prefetch side stream only)
PREFETCH_ONLY_AXES = {"prefetch": False, "stream_priority": 0, "sm_limit": 0}


def keys_for(kind: str, *, unit: str | None = None, scalar: bool | None = None) -> tuple[str, ...]:
    """Field names a record of ``kind`` (lookup | step) carries, optionally of one unit,
    or only scalars (no per-sample lists)."""
    out = []
    for f in FIELDS:
        if f.kinds not in ("all", kind) or f.legacy:
            continue
        if unit is not None and f.unit != unit:
            continue
        if scalar is not None and scalar == _is_list(f):
            continue
        out.append(f.name)
    return tuple(out)


def _is_list(f: Field) -> bool:
    """A per-sample list (not a scalar, for :func:`keys_for`); ``unstable_measurements``, a list of
    names, counts as a scalar there, as it always has."""
    return f.name.endswith(("samples_ms", "_throttled", "rank_medians_ms", "rank_outcomes", "missing_fields"))


# ------------------------------------------------------------------ derived figures

def num(value: Any) -> float | None:
    """A finite float, or None (for None, text that is no number, NaN, inf, booleans) -- how a
    stored value is read as a number: once, at load, by :func:`coerce_record` for every float and
    int field; a reader of a loaded record reads the typed field (:class:`Record`)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


_num = num


# ------------------------------------------------------------------ typed access, generated from the schema

#: the type of every case axis a record carries (:class:`~ple_bench.spec.case.Case`'s annotations;
#: ``extra`` is stored as a dict)
AXIS_TYPES: dict[str, str] = {f.name: (f.type if f.type in ("int", "float", "bool", "str") else "dict")
                              for f in dataclasses.fields(Case)}
#: every name a record's reader may ask for, with its type: the schema's fields and the case axes
FIELD_TYPES: dict[str, str] = {**AXIS_TYPES, **{f.name: f.type for f in FIELDS}}


def _int(value: Any) -> int | float | None:
    f = num(value)
    if f is None:
        return None
    return int(f) if f.is_integer() else f  # a count stored with a fraction keeps it: never rounded away


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


def _list(item: Any) -> Any:
    return lambda value: [item(v) for v in value] if isinstance(value, (list, tuple)) else None


def _as_stored(value: Any) -> Any:
    return value


_COERCE = {"float": num, "int": _int, "bool": _bool, "str": _as_stored, "dict": _as_stored,
           "list[float]": _list(num), "list[bool]": _list(_bool), "list[str]": _list(_as_stored),
           "list[dict]": _list(_as_stored)}


def coerce(value: Any, type_: str) -> Any:
    """``value`` as a field of ``type_`` (:data:`TYPES`) reads it: a finite float or None
    (:func:`num`: strings of numbers are read, NaN, inf, booleans and text are None); an int (a
    whole float becomes one; a count stored with a fraction stays the float); a bool (also from
    0 / 1 and "true" / "false"), else None; a list of such items, else None; text and dicts as
    stored."""
    return None if value is None else _COERCE[type_](value)


def coerce_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a stored record with every schema field and case axis coerced to its declared
    type (:data:`FIELD_TYPES`, :func:`coerce`); keys the schema does not name are kept as stored.
    What :func:`ple_bench.results.load_records` does to each record, once, at load."""
    return {k: (coerce(v, FIELD_TYPES[k]) if k in FIELD_TYPES else v) for k, v in rec.items()}


class Record(dict):
    """A loaded record, read-only, with typed attribute access generated from the schema: each
    field of :data:`FIELDS` and each case axis is a property (``rec.step_ms``: a float or None;
    ``rec.num_tokens``: an int or None; a field the record lacks is None), and any other
    attribute is an ``AttributeError`` naming it.  The values are coerced once, when the view is
    made (:func:`coerce_record`); item access and ``.get`` read the same values, and keys the
    schema does not name (a report's ``path`` label) stay readable by item.  It is a dict (json,
    pandas and ``dict(rec)`` take it as one); ``dict(rec)`` is the writable copy."""

    __slots__ = ()

    def __init__(self, data: Mapping[str, Any] = (), /, **more: Any) -> None:
        merged = dict(data, **more)
        super().__init__(merged if isinstance(data, Record) and not more else coerce_record(merged))

    def __getattr__(self, name: str) -> Any:
        # only called for names that are no property: the schema's fields all are
        raise AttributeError(f"a record has no field {name!r}: not in the schema (ple_bench.record.FIELDS) "
                             "nor a case axis (ple_bench.spec.case.Case)")

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a Record is read-only: dict(record) is a writable copy")

    __setitem__ = __delitem__ = __ior__ = _read_only
    update = pop = popitem = setdefault = clear = _read_only

    def __setattr__(self, name: str, value: Any) -> None:
        self._read_only()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Record, (dict(self),))

    def __repr__(self) -> str:
        return f"Record({dict.__repr__(self)})"


def _field_property(name: str, type_: str, doc: str) -> property:
    def read(self: Record) -> Any:
        return dict.get(self, name)
    read.__name__ = name
    read.__annotations__ = {"return": f"{type_} | None"}
    return property(read, doc=doc)


def _generate_record_properties() -> None:
    docs = {f.name: f"{f.definition} ({f.unit})" if f.unit else f.definition for f in FIELDS}
    for name, type_ in FIELD_TYPES.items():
        if hasattr(dict, name) or hasattr(Record, name):
            raise TypeError(f"record field {name!r} shadows a dict or Record attribute: rename it")
        setattr(Record, name, _field_property(name, type_, docs.get(name, f"the case axis {name}")))


_generate_record_properties()


def as_record(rec: Mapping[str, Any]) -> Record:
    """``rec`` as a :class:`Record` (itself when it is one)."""
    return rec if isinstance(rec, Record) else Record(rec)


def twin_key(rec: Mapping[str, Any]) -> str:
    """The key a step shares with its prefetch-off twin: every case axis, with the
    prefetch-only settings (prefetch, stream_priority, sm_limit) at their off values."""
    axes = {}
    for f in dataclasses.fields(Case):
        default = f.default if f.default is not dataclasses.MISSING else None
        value = rec.get(f.name, default)
        if f.name == "extra":
            value = dict(value) if isinstance(value, (dict, list, tuple)) and value else {}
        axes[f.name] = value
    axes.update(PREFETCH_ONLY_AXES)
    return json.dumps(axes, sort_keys=True, default=str)


def is_prefetch_off_twin(rec: Mapping[str, Any]) -> bool:
    """A step record that can be the twin of prefetch steps (ok, prefetch off, exposed_ms known)."""
    return (rec.get("kind") == "step" and rec.get("status") == "ok" and not rec.get("prefetch")
            and not rec.get("stream_priority") and not rec.get("sm_limit")
            and _num(rec.get("exposed_ms")) is not None)


def twins_of(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, float]]:
    """twin key -> (case_id, exposed_ms) of the prefetch-off steps among ``records``."""
    out: dict[str, tuple[str, float]] = {}
    for r in records:
        if is_prefetch_off_twin(r):
            out[twin_key(r)] = (str(r.get("case_id")), float(r["exposed_ms"]))
    return out


#: case axes that name the path, not the workload: a pinned step's resident baseline may differ in
#: these (it is the device table, ids on the device, in its own best graph mode)
PATH_AXES = ("impl", "kernel", "graph", "prefetch", "ids_on", "host_alloc", "gather_threads", "cache_rows",
             "grid_frac", "stream_priority", "sm_limit", "extra")


def baseline_key(rec: Mapping[str, Any]) -> str:
    """The key a step shares with the resident step a server would run instead: every case
    axis but the path's own (:data:`PATH_AXES`) -- the table, shape, heads, tokens, compute,
    id distribution and seed, and topology.  Prefetch is the path's: a resident table read on
    a side stream is a choice its server makes or not, as its graph mode is."""
    axes = {}
    for f in dataclasses.fields(Case):
        if f.name in PATH_AXES:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        axes[f.name] = rec.get(f.name, default)
    return json.dumps(axes, sort_keys=True, default=str)


@dataclass(frozen=True)
class ResidentFigure:
    """One figure of a resident step that can be a baseline: its case, graph mode, prefetch and timer."""

    case_id: str
    graph: str
    timer: str
    ms: float
    prefetch: bool = False


def resident_figures(rec: Mapping[str, Any]) -> list[ResidentFigure]:
    """The baseline figures a resident step record offers (none unless it is an ok device-table
    step with ids on the device): its own step on its timer, its host-sync twin, and the full
    graph of a breakable step on either timer."""
    if (rec.get("kind") != "step" or rec.get("status") != "ok" or not device_resident(rec)
            or (rec.get("ids_on") or "device") != "device"):
        return []
    cid, graph, timer = str(rec.get("case_id")), str(rec.get("graph") or "eager"), str(rec.get("timer"))
    prefetch = bool(rec.get("prefetch"))
    out = []
    for ms_key, g, t in (("step_ms", graph, timer), ("step_host_sync_ms", graph, "host_sync"),
                         ("full_step_ms", "full", timer), ("full_step_host_sync_ms", "full", "host_sync")):
        ms = _num(rec.get(ms_key))
        if ms is not None and ms > 0:
            out.append(ResidentFigure(cid, g, t, ms, prefetch))
    return out


class Peers:
    """What a record's derived figures read from the other records of its run: the
    prefetch-off twins (``overlap_efficiency``) and the resident steps (``offload_overhead``).
    :meth:`add` a record once it is derived; :meth:`of` the records of a stored run."""

    def __init__(self, twins: Mapping[str, tuple[str, float]] | None = None) -> None:
        self.twins: dict[str, tuple[str, float]] = dict(twins or {})
        self.residents: dict[str, list[ResidentFigure]] = {}

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> "Peers":
        peers = cls()
        for r in records:
            peers.add(r)
        return peers

    def add(self, rec: Mapping[str, Any]) -> None:
        if is_prefetch_off_twin(rec):
            self.twins[twin_key(rec)] = (str(rec.get("case_id")), float(rec["exposed_ms"]))
        figures = resident_figures(rec)
        if figures:
            self.residents.setdefault(baseline_key(rec), []).extend(figures)

    def baseline(self, rec: Mapping[str, Any], like_for_like: bool = False) -> ResidentFigure | None:
        """The resident figure ``rec`` is held against: same baseline key, ``rec``'s timer, the
        fastest graph mode and prefetch setting measured (``like_for_like``: ``rec``'s own graph
        mode and prefetch only); None when the run has none."""
        timer = str(rec.get("timer"))
        graph, prefetch = str(rec.get("graph") or "eager"), bool(rec.get("prefetch"))
        found = [f for f in self.residents.get(baseline_key(rec), ())
                 if f.timer == timer and (not like_for_like or (f.graph, f.prefetch) == (graph, prefetch))]
        return min(found, key=lambda f: f.ms) if found else None


def _peers(peers: "Peers | Mapping[str, tuple[str, float]] | None") -> Peers:
    return peers if isinstance(peers, Peers) else Peers(peers)


def device_resident(rec: Mapping[str, Any]) -> bool:
    """The table is in device memory: the declared capability when the record has it, else what
    its built-in impl declares (:mod:`ple_bench.impl_facts`; False for an impl it does not know)."""
    declared = rec.get("table_in_host_memory")
    if isinstance(declared, bool):
        return not declared
    facts = facts_of(rec.get("impl"))
    return facts is not None and not facts.table_in_host_memory


def row_ceiling(ceilings: Mapping[str, Any], base: str, row_bytes: Any) -> tuple[str, float, int] | None:
    """``<base>_<N>B`` measured at ``row_bytes`` when stored, else at the nearest measured
    row size (ties: the larger); (name, GB/s, N), or None."""
    pattern = re.compile(re.escape(base) + r"_(\d+)B$")
    found = []
    for name, value in (ceilings or {}).items():
        m = pattern.match(str(name))
        v = _num(value)
        if m and v is not None and v > 0:
            found.append((int(m.group(1)), str(name), v))
    if not found:
        return None
    rb = _num(row_bytes) or 0
    size, name, value = min(found, key=lambda t: (abs(t[0] - rb), -t[0]))
    return name, value, size


def random_row_ceiling_name(key: Any, *, at_rows: bool = False) -> str:
    """The ``ceiling`` name of a random-row ceiling from its meta.json key
    (``<memory>:...[:<host_alloc>][:sorted]``, :func:`ple_bench.measure.ceilings.random_row_key`):
    ``<memory>_random_row``, ``<memory>_sorted_random_row`` for the rows gathered in ascending
    id order (a kernel that reads them so), ``_at_rows`` appended for the ceiling at the lookup's
    own row count."""
    parts = str(key or "").split(":")
    memory = parts[0]
    name = "sorted_random_row" if len(parts) > 1 and parts[-1] == "sorted" else "random_row"
    name = f"{memory}_{name}" if memory else name
    return f"{name}_at_rows" if at_rows else name


def choose_ceiling(rec: Mapping[str, Any], ceilings: Mapping[str, Any]) -> dict[str, Any]:
    """The ceiling a lookup record is held against (see the ``ceiling`` field):
    ``{"ceiling", "ceiling_gbps", "ceiling_row_bytes", "pct_of_ceiling", "ceiling_exceeded"}``,
    None where unknown.  In order: a host path's host-gather ceiling; the lookup's own
    random-row ceiling (``random_row_ceiling_gbps``); functional mode's host memcpy; the
    run-wide random-row ceiling of the table's memory at the row size (older records)."""
    out: dict[str, Any] = {"ceiling": None, "ceiling_gbps": None, "ceiling_row_bytes": None,
                           "pct_of_ceiling": None, "ceiling_exceeded": None}
    gbps = _num(rec.get("gbps"))
    own = _num(rec.get("random_row_ceiling_gbps"))
    at_rows = _num(rec.get("random_row_ceiling_at_rows_gbps"))
    facts = facts_of(rec.get("impl"))
    mechanism = rec.get("lookup_mechanism") or (facts.lookup_mechanism if facts else None)
    if mechanism == "host_copy" and rec.get("mode") in (None, "gpu"):
        value = _num((ceilings or {}).get("h2d_gbps"))
        out["ceiling"] = "h2d_gbps"
        out["ceiling_gbps"] = value if value and value > 0 else None
        if gbps is not None and out["ceiling_gbps"]:
            out["pct_of_ceiling"] = 100.0 * gbps / out["ceiling_gbps"]
        return _flag(out)
    if _num(rec.get("host_gather_ceiling_ms")):
        ms = float(rec["host_gather_ceiling_ms"])
        out["ceiling"] = "host_gather"
        nbytes = _bytes(rec)
        out["ceiling_gbps"] = nbytes / (ms * 1e6) if nbytes and ms > 0 else None
        out["ceiling_row_bytes"] = _int(rec.get("row_bytes"))  # a byte count: an int, as row_ceiling gives
        median = _num(rec.get("median_ms"))
        out["pct_of_ceiling"] = 100.0 * ms / median if median and median > 0 else None
        return _flag(out)
    if at_rows is not None and at_rows > 0:
        out["ceiling"] = random_row_ceiling_name(rec.get("random_row_ceiling_at_rows"), at_rows=True)
        out["ceiling_gbps"] = at_rows
        out["ceiling_row_bytes"] = _int(rec.get("row_bytes"))  # a byte count: an int, as row_ceiling gives
    elif own is not None and own > 0:
        out["ceiling"] = random_row_ceiling_name(rec.get("random_row_ceiling"))
        out["ceiling_gbps"] = own
        out["ceiling_row_bytes"] = _int(rec.get("row_bytes"))  # a byte count: an int, as row_ceiling gives
    elif rec.get("mode") not in (None, "gpu"):
        value = _num((ceilings or {}).get("host_memcpy_gbps"))
        out["ceiling"] = "host_memcpy_gbps"
        out["ceiling_gbps"] = value if value and value > 0 else None
    else:
        base = "device_random_row_gbps" if device_resident(rec) else "pinned_random_row_gbps"
        hit = row_ceiling(ceilings, base, rec.get("row_bytes"))
        if hit is None:
            return out
        out["ceiling"], out["ceiling_gbps"], out["ceiling_row_bytes"] = hit
    if gbps is not None and out["ceiling_gbps"]:
        out["pct_of_ceiling"] = 100.0 * gbps / out["ceiling_gbps"]
    return _flag(out)


def _flag(out: dict[str, Any]) -> dict[str, Any]:
    pct = out.get("pct_of_ceiling")
    out["ceiling_exceeded"] = None if pct is None else bool(pct > CEILING_SLACK_PCT)
    return out


def _bytes(rec: Mapping[str, Any]) -> float | None:
    rows, row_bytes = _num(rec.get("rows")), _num(rec.get("row_bytes"))
    if rows is not None and row_bytes is not None:
        return rows * row_bytes
    return _num(rec.get("bytes_moved"))


def derive(rec: dict[str, Any], ceilings: Mapping[str, Any] | None,
           peers: "Peers | Mapping[str, tuple[str, float]] | None" = None) -> dict[str, Any]:
    """Fill the derived fields of ``rec`` (in place; also returned): the one place
    they are computed.  ``ceilings``: meta.json's; ``peers``: :class:`Peers` of the run's
    records so far (or only its prefetch-off twins, :func:`twins_of`)."""
    ceilings = ceilings or {}
    rec["schema_version"] = SCHEMA_VERSION
    kind = rec.get("kind") or "lookup"
    _derive_interval(rec, kind)
    for key in ("gbps", "rows_per_s", "ceiling", "ceiling_gbps", "ceiling_row_bytes", "pct_of_ceiling",
                "ceiling_exceeded", "pct_of_bandwidth_ceiling"):
        rec[key] = None
    if kind == "step":
        _derive_step(rec, _peers(peers), ceilings)
        return rec
    if kind == "serve":
        _derive_serve(rec)
        return rec
    rec["overlap_efficiency"] = rec["overlap_twin"] = None
    if rec.get("status") != "ok":
        return rec
    median = _num(rec.get("median_ms"))
    nbytes, rows = _bytes(rec), _num(rec.get("rows"))
    if median and median > 0 and rows:
        rec["rows_per_s"] = rows / (median / 1e3)
        if nbytes is not None:
            rec["gbps"] = nbytes / (median * 1e6)
    rec.update(choose_ceiling(rec, ceilings))
    bandwidth = _num(rec.get("random_row_ceiling_gbps"))
    if rec["gbps"] is not None and bandwidth:
        rec["pct_of_bandwidth_ceiling"] = 100.0 * rec["gbps"] / bandwidth
    return rec


def _derive_step(rec: dict[str, Any], peers: Peers, ceilings: Mapping[str, Any] | None = None) -> None:
    rec["overlap_efficiency"] = rec["overlap_twin"] = None
    _derive_offload(rec, peers)
    if rec.get("status") == "ok" and rec.get("prefetch"):
        twin = peers.twins.get(twin_key(rec))
        exposed = _num(rec.get("exposed_ms"))
        if twin is not None:
            rec["overlap_twin"] = twin[0]
            if exposed is not None and twin[1] > 0:
                rec["overlap_efficiency"] = 1.0 - exposed / twin[1]
    in_step, alone = _num(rec.get("compute_in_step_ms")), _num(rec.get("compute_region_alone_ms"))
    if not has_compute(rec):
        rec["compute_slowdown"] = None  # no compute: nothing to slow down
    elif rec.get("compute_slowdown_note"):
        rec["compute_slowdown"] = None  # launches, not the GPU, could be what is slow
    elif in_step is not None and alone is not None and alone > 0:
        rec["compute_slowdown"] = in_step / alone - 1.0
    elif rec.get("status") == "ok" and "compute_region_alone_ms" in rec:
        rec["compute_slowdown"] = None  # measured, but no region to compare
    # else: an upgraded record without the regions keeps its stored figure
    rec["compute_hbm_gbps"] = rec["compute_pct_of_d2d"] = rec["compute_pct_of_hbm_read"] = None
    nbytes, compute_ms = _num(rec.get("compute_bytes")), _num(rec.get("compute_ms"))
    if rec.get("status") == "ok" and nbytes and compute_ms and compute_ms > 0:
        rec["compute_hbm_gbps"] = nbytes / (compute_ms * 1e6)
        d2d = _num((ceilings or {}).get("d2d_gbps"))
        if rec.get("mode") in (None, "gpu") and d2d and d2d > 0:
            rec["compute_pct_of_d2d"] = 100.0 * rec["compute_hbm_gbps"] / d2d
        read = _num((ceilings or {}).get("hbm_read_gbps"))
        if rec.get("mode") in (None, "gpu") and read and read > 0:
            rec["compute_pct_of_hbm_read"] = 100.0 * rec["compute_hbm_gbps"] / read


def _derive_interval(rec: dict[str, Any], kind: str) -> None:
    """A repeated case's 95 % interval of its figure, over its processes (:mod:`ple_bench.uncertainty`)."""
    rec["ci_low_ms"] = rec["ci_high_ms"] = None
    reps = rec.get("replicates")
    if rec.get("status") != "ok" or not isinstance(reps, list) or not reps:
        return
    figure = "median_ms" if kind == "lookup" else "step_ms"
    got = interval(observations(reps, figure), seed_text=str(rec.get("case_id")))
    if got is not None:
        rec["ci_low_ms"], rec["ci_high_ms"] = got.low, got.high


def _derive_serve(rec: dict[str, Any]) -> None:
    """A served step's throughput and TPOT (one token per sequence per step)."""
    rec["overlap_efficiency"] = rec["overlap_twin"] = None
    rec["tokens_per_s"] = rec["tpot_ms"] = None
    rec["tokens_per_s_ci_low"] = rec["tokens_per_s_ci_high"] = None
    step_ms, batch = _num(rec.get("step_ms")), _num(rec.get("serve_batch"))
    if rec.get("status") == "ok" and step_ms and step_ms > 0 and batch:
        rec["tokens_per_s"] = batch / (step_ms / 1e3)
        rec["tpot_ms"] = step_ms
        low, high = _num(rec.get("ci_low_ms")), _num(rec.get("ci_high_ms"))
        if low and high:
            rec["tokens_per_s_ci_low"], rec["tokens_per_s_ci_high"] = batch / (high / 1e3), batch / (low / 1e3)


_OFFLOAD_KEYS = ("offload_overhead", "offload_baseline", "offload_baseline_ms", "offload_baseline_graph",
                 "offload_baseline_timer", "offload_baseline_note", "offload_overhead_same_graph",
                 "offload_baseline_same_graph", "offload_baseline_same_graph_ms")


def _derive_offload(rec: dict[str, Any], peers: Peers) -> None:
    """``offload_overhead`` of a pinned step against the resident step a server would run
    instead (:meth:`Peers.baseline`), and against the resident step of its own graph mode."""
    for key in _OFFLOAD_KEYS:
        rec[key] = None
    if rec.get("status") != "ok" or device_resident(rec):
        return  # resident steps carry no overhead: they are the reference
    step_ms = _num(rec.get("step_ms"))
    best = peers.baseline(rec)
    if best is None:
        rec["offload_baseline_note"] = (
            f"the run has no resident step (impl device, ids on the device) with this step's table, shape, "
            f"tokens, compute, id distribution, seed and topology on its timer ({rec.get('timer')})")
        return
    rec.update(offload_baseline=best.case_id, offload_baseline_ms=best.ms, offload_baseline_graph=best.graph,
               offload_baseline_timer=best.timer)
    if step_ms is not None:
        rec["offload_overhead"] = step_ms / best.ms - 1.0
    same = peers.baseline(rec, like_for_like=True)
    if same is not None:
        rec.update(offload_baseline_same_graph=same.case_id, offload_baseline_same_graph_ms=same.ms)
        if step_ms is not None:
            rec["offload_overhead_same_graph"] = step_ms / same.ms - 1.0


# ------------------------------------------------------------------ the one assembler

@dataclass
class CaseResult:
    """What a case's worker reports (picklable: it crosses the worker pool's pipes and, under
    torchrun, stays in the process): how the case ended, what it measured, and what its backend
    declares.  :func:`build` is the one place a record is assembled from it.

    ``measurement`` holds the record fields the case measured (the timings and their summary, the
    rows moved, the ceilings' shares, a step's or a served step's figures, a skipped served
    step's capacity rule); the other fields are the facts every record carries beside it."""

    status: str = "ok"  # ok | skipped | invalid | failed (results.STATUSES)
    reason: str = ""
    measurement: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the backend's declared facts, read in the worker (None: the case never reached a worker
    #: that could resolve its impl)
    lookup_mechanism: str | None = None
    table_in_host_memory: bool | None = None
    kernel_ran: str | None = None  # the kernel the backend ran (kernel paths of measured cases)
    table_cost: dict[str, Any] = dataclasses.field(default_factory=dict)  # the table's host allocation
    traffic: dict[str, Any] = dataclasses.field(default_factory=dict)  # unique_rows_fraction, ids_trace
    #: the per-case ceilings measured for it, for meta.json (never record fields): the host-gather
    #: ceiling entry and the random-row ceiling entries (run.provenance.keep_case_ceilings)
    host_gather_ceiling: dict[str, Any] | None = None
    random_row_ceilings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    traceback: str | None = None  # a failed case's
    rank_outcomes: list[dict[str, Any]] | None = None  # under torchrun, when the ranks disagreed
    #: where the worker ran it (:func:`ple_bench.measure.placement.process_facts`; repeated cases only)
    process: dict[str, Any] | None = None
    duration_s: float | None = None  # stamped by whoever ran the case (dispatch, torchrun)
    finished_at: str | None = None

    def fields(self) -> dict[str, Any]:
        """Everything the worker reported as one flat dict (what an in-process caller of
        ``CaseExecutor.run`` reads): the measurement, the table cost, the traffic, ``kernel_ran``,
        and the per-case ceiling entries under ``host_gather_ceiling`` / ``random_row_ceiling_entry``."""
        out = dict(self.measurement)
        out.update(self.table_cost)
        out.update(self.traffic)
        out["kernel_ran"] = self.kernel_ran
        if self.host_gather_ceiling is not None:
            out["host_gather_ceiling"] = self.host_gather_ceiling
        if self.random_row_ceilings:
            out["random_row_ceiling_entry"] = self.random_row_ceilings
        return out


@dataclass
class RunContext:
    """What a record takes from its run: the run's ``meta.json`` (its mode, and its ceilings as
    they are when the record is built) and the :class:`Peers` of its records so far."""

    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    peers: Peers = dataclasses.field(default_factory=Peers)

    @property
    def mode(self) -> str | None:
        return self.meta.get("mode")

    @property
    def ceilings(self) -> Mapping[str, Any]:
        return self.meta.get("ceilings") or {}


def build(case: Case, result: CaseResult, run: RunContext) -> dict[str, Any]:
    """The record of ``case`` from its worker's ``result``: the one place a record is
    assembled.  Its identity and outcome, the case's axes and world size, what it measured, the
    backend's declared facts, then its derived figures (:func:`derive`, with the run's ceilings
    and peers).  The caller adds it to ``run.peers`` once written."""
    rec: dict[str, Any] = {"case_id": case.case_id, "status": result.status, "reason": result.reason,
                           "mode": run.mode, "finished_at": result.finished_at}
    rec.update(case.axes())
    rec["world_size"] = case.world_size
    rec.update(result.measurement)
    rec.update(result.table_cost)
    rec.update(result.traffic)
    rec["kernel_ran"] = result.kernel_ran
    rec["lookup_mechanism"] = result.lookup_mechanism
    rec["table_in_host_memory"] = result.table_in_host_memory
    rec["traceback"] = result.traceback
    rec["rank_outcomes"] = result.rank_outcomes
    rec["duration_s"] = result.duration_s
    return derive(rec, run.ceilings, run.peers)


# ------------------------------------------------------------------ upgrades

def upgrade(records: list[dict[str, Any]], meta: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Records of a stored run in the current schema (copies; current ones unchanged).

    Version 5 records (and older): the offload figures are derived again with :class:`Peers`;
    a version-4 (or older) record's stored ``offload_overhead`` is kept as ``legacy_offload_overhead``.
    Version 3 records (and older) holding a host-gather ceiling get
    ``host_gather_ceiling_gather = "index_select"``: the one gather that ceiling timed.
    Version 2 records: the derived fields are derived again (``ceiling_exceeded`` is new;
    they keep the run-wide ceilings they were held against), ``missing_fields`` lists
    the version-3 fields they lack.  Version 1 records (no ``schema_version``): nothing
    is recomputed from samples;
    what the schema derives from stored fields is derived (:func:`derive`, with the
    run's ceilings and its prefetch-off steps as twins), ``row_bytes`` /
    ``table_bytes`` from ``dim`` / ``dtype`` / ``vocab_size`` where absent, a step's
    ``median_ms`` from ``step_ms``; the old GB/s figures of steps are dropped, the old
    clamped overlap is kept as ``legacy_overlap_efficiency``; ``upgraded_from`` = 1 and
    ``missing_fields`` lists the fields of the record's kind it does not have."""
    ceilings = (meta or {}).get("ceilings") or {}
    old = [r for r in records if _version(r) < SCHEMA_VERSION]
    if not old:
        return records
    fixed = [(_upgrade_fields(dict(r)) if _version(r) == 1 else dict(r)) if _version(r) < SCHEMA_VERSION else r
             for r in records]
    peers = Peers.of(fixed)
    out = []
    for original, rec in zip(records, fixed):
        version = _version(original)
        if version >= SCHEMA_VERSION:
            out.append(rec)
            continue
        kind = rec.get("kind") or "lookup"
        stored = set(original)
        if (version == 1 and kind == "step" and original.get("prefetch")
                and original.get("overlap_efficiency") is not None):
            rec["legacy_overlap_efficiency"] = original.get("overlap_efficiency")
        if kind == "step" and version <= 4 and _num(original.get("offload_overhead")) is not None:
            rec["legacy_offload_overhead"] = original.get("offload_overhead")
        derive(rec, ceilings, peers)
        if _num(rec.get("host_gather_ceiling_ms")) is not None and not rec.get("host_gather_ceiling_gather"):
            rec["host_gather_ceiling_gather"] = "index_select"  # schema <= 3: the only gather timed
        rec["upgraded_from"] = version
        rec["missing_fields"] = [k for k in keys_for(kind) if k not in stored and k not in DERIVED_KEYS
                                 and k not in _UPGRADE_FILLED and rec.get(k) is None]
        out.append(rec)
    return out


_UPGRADE_FILLED = ("schema_version", "upgraded_from", "missing_fields", "row_bytes", "table_bytes",
                   "host_gather_ceiling_gather")


def _version(rec: Mapping[str, Any]) -> int:
    v = rec.get("schema_version")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 1


def _upgrade_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """The version-1 fields a version-2 record names or derives differently."""
    if _num(rec.get("row_bytes")) is None and _num(rec.get("dim")) is not None and rec.get("dtype") in DTYPE_BYTES:
        rec["row_bytes"] = int(rec["dim"]) * DTYPE_BYTES[rec["dtype"]]
    if (_num(rec.get("table_bytes")) is None and _num(rec.get("row_bytes")) is not None
            and _num(rec.get("vocab_size")) is not None):
        rec["table_bytes"] = int(rec["row_bytes"]) * int(rec["vocab_size"])
    if (rec.get("kind") == "step" and _num(rec.get("median_ms")) is None
            and _num(rec.get("step_ms")) is not None):
        rec["median_ms"] = rec["step_ms"]
    if rec.get("kind") == "step":
        rec.pop("pct_of_random_row_ceiling", None)  # steps carry no GB/s, so no share of a ceiling
    return rec


# ------------------------------------------------------------------ documentation

def markdown() -> str:
    """The schema as a markdown table (``python -m ple_bench schema``; the README's record section)."""
    lines = [f"Record schema version {SCHEMA_VERSION} (`ple_bench/record.py`). Kinds: the cases that carry "
             "the field; derived: computed by `record.derive` before the record is written.", "",
             "| field | unit | kinds | derived | definition |", "|---|---|---|---|---|"]
    for f in FIELDS:
        definition = f.definition.replace("|", "\\|")
        lines.append(f"| `{f.name}` | {f.unit} | {f.kinds} | {'yes' if f.derived else ''}"
                     f"{'legacy' if f.legacy else ''} | {definition} |")
    return "\n".join(lines) + "\n"


__all__ = ["CaseResult", "RunContext", "build", "SCHEMA_VERSION", "TYPES", "FIELD_TYPES", "AXIS_TYPES", "Record",
           "as_record", "coerce", "coerce_record", "num", "CEILING_SLACK_PCT", "Field", "FIELDS", "BY_NAME", "RECORD_KEYS", "DERIVED_KEYS",
           "HOST_ALLOC_KEYS", "keys_for", "derive", "choose_ceiling", "row_ceiling", "twin_key", "twins_of",
           "Peers", "baseline_key", "resident_figures", "PATH_AXES",
           "upgrade", "markdown", "device_resident"]
