"""Runs one case on one rank: build (or reuse) the table, make the ids, check the
output against the reference, then measure.  Knows the backends only through
the registry and the contract :class:`~ple_bench.backends.base.PLEEmbedding`
declares (its capabilities and public operations: nothing private, no probing
by name; ``tests/test_contract.py`` keeps it so).

A case that cannot run here raises :class:`SkipCase`; a wrong output raises
:class:`InvalidCase` (it is never timed); anything else is a failure."""

from __future__ import annotations

import contextlib
import gc
import os
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from .. import measure as m, traces
from ..annotate import annotate
from ..backends import fast_kernels, get_backend, synthetic_rows
from ..backends.cuda import host_alloc
from ..backends.kernels import get_kernel, kernel_names, takes_grid_cap
from ..measure import ceilings as ceil, host_gather_ceiling
from ..measure.ceilings import HOST_GATHER_ID_SETS
from ..measure.fields import lockstep, measurement_fields, sm_limit_fields
from ..parallel import Groups, Topology
from ..record import CaseResult
from ..spec.case import Case
from ..traces import TraceUnavailable
from ..workload import make_id_sets, make_ids, parse_ids_spec, warmup_ids
from . import serve as serve_mod, step as step_mod
from .outcome import CaseOutcome, InvalidCase, SkipCase

FP8_SCALE = 0.5
TABLE_SEED_BASE = 1234
RANDOM_ROW_SEED = 271_828  # the id sets of random-row ceilings (independent of every case's)
_DP_SEED_STRIDE = 1_000_003


def host_memory_bytes() -> int:
    """Memory this process may use: an explicit override, the cgroup limit, or MemTotal."""
    override = os.environ.get("PLE_BENCH_HOST_MEM_BYTES")
    if override:
        return int(override)
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
            if text.isdigit():
                limits.append(int(text))
        except OSError:
            pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return min(limits) if limits else 1 << 40


def host_memory_available_bytes() -> int:
    """Host memory a new table may take now: MemAvailable, at most :func:`host_memory_bytes`
    (``PLE_BENCH_HOST_MEM_BYTES``, when set, stands for both)."""
    limit = host_memory_bytes()
    if os.environ.get("PLE_BENCH_HOST_MEM_BYTES"):
        return limit
    free = host_alloc.mem_available_bytes()
    return min(limit, free) if free is not None else limit


def backend_facts(impl: str) -> tuple[str | None, bool | None]:
    """The backend's declared ``lookup_mechanism`` and ``table_in_host_memory`` (record fields),
    read where the case runs; (None, None) when ``impl`` cannot be resolved here."""
    try:
        cls = get_backend(impl)
    except Exception:  # noqa: BLE001 - an unknown backend: the schema falls back on the impl name
        return None, None
    return cls.lookup_mechanism(), bool(cls.table_in_host_memory)


@dataclass
class _Table:
    key: tuple
    backend: Any
    seed: int
    cost: dict = field(default_factory=dict)  # what the table's host allocation took (record fields)
    uses: int = 0
    rows_key: tuple = ()  # the filled rows' identity: rows, dim, dtype, allocation, seed, topology


@dataclass
class CaseExecutor:
    """Per-process state: the device, this rank's groups and the table it holds."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    groups_by_topology: dict = field(default_factory=dict)
    table: _Table | None = None
    #: keep tables a case no longer needs for a later case of this process (a repeated group's
    #: rounds alternate the resident table and the pinned one: neither is built twice)
    park_tables: bool = False
    parked: dict = field(default_factory=dict)  # table key -> _Table; ("rows", rows_key) -> (handed, _Table)
    host_gather_ceilings: dict = field(default_factory=dict)  # (table bytes, rows, row bytes) -> fields
    random_row_ceilings: dict = field(default_factory=dict)  # ceilings.random_row_key -> fields

    # ------------------------------------------------------------ helpers
    def groups_for(self, topo: Topology) -> Groups:
        if topo.world_size == 1:
            return Groups.single()
        if topo not in self.groups_by_topology:
            self.groups_by_topology[topo] = Groups.build(topo)
        return self.groups_by_topology[topo]

    def reset(self) -> None:
        """Forget everything built for earlier cases: the table and this rank's process groups (after
        the process groups were rebuilt, the old ones are gone)."""
        self.release_table()
        self.groups_by_topology.clear()

    def _park_current(self) -> None:
        """Put the current table aside (:attr:`park_tables`): a table whose backend hands it over
        is kept as its filled rows (the backend closed: no thread team left running beside the
        next case), any other with its backend."""
        current, self.table = self.table, None
        if current is None:
            return
        handed = current.backend.hand_over_table()
        if handed is not None:
            current.backend.close()
            self.parked[("rows", current.rows_key)] = (handed, current)
        else:
            self.parked[current.key] = current

    def release_table(self) -> None:
        for entry in self.parked.values():
            backend = entry.backend if isinstance(entry, _Table) else None
            if backend is not None:
                backend.close()
            else:
                entry[0].allocation.close()
        self.parked.clear()
        if self.table is not None:
            self.table.backend.close()
            self.table = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _check_memory(self, case: Case, cls: type, shard_bytes: int) -> None:
        needs_host = cls.table_in_host_memory
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            dev_need = 0 if needs_host else shard_bytes
            dev_need += 64 << 20
            if dev_need > free * 0.92:
                raise SkipCase(
                    f"table shard needs {dev_need / 2**30:.1f} GiB of device memory, "
                    f"{free / 2**30:.1f} GiB free"
                )
            if needs_host:
                def fit() -> str | None:
                    # One rank: what is free now.  Several: the host's size, the same on every rank
                    # (ranks allocate concurrently; a check on what is free now could skip on one
                    # rank and not on another, leaving the others waiting in a collective).
                    available = host_memory_available_bytes() if self.world_size == 1 else host_memory_bytes()
                    return host_alloc.host_fit(shard_bytes, self.world_size, case.host_alloc, pinned=True,
                                               available=available)

                reason = fit()
                if (reason is not None and self.world_size == 1 and case.host_alloc == "torch"
                        and host_alloc.cached_table_block(shard_bytes)):
                    # torch's cache holds a closed table's block of this size class (the 32 GiB
                    # table's 64 GiB block for the 47.7 GiB table): the table takes it, no new
                    # host memory, nothing pinned again (its record: host_alloc_from_cache True;
                    # False would say torch pinned a new block after all)
                    reason = None
                if reason is not None:
                    # torch keeps freed pinned blocks cached: give them back, then look again
                    host_alloc.release_cached_pinned_blocks()
                    reason = fit()
                if reason is not None:
                    raise SkipCase(reason)
        else:
            reason = host_alloc.host_fit(shard_bytes, self.world_size, case.host_alloc, pinned=False,
                                         available=host_memory_bytes())
            if reason is not None:
                raise SkipCase(reason)

    def backend_for(self, case: Case, topo: Topology, groups: Groups):
        # the token count is not part of the table: a case with another batch size reuses the
        # filled table and resizes the buffers sized by it (one allocation per table per run;
        # suite_loop.order_cases puts the cases of one key next to each other)
        key = (case.table_key, topo)
        if self.park_tables and key in self.parked and (self.table is None or self.table.key != key):
            self._park_current()
            self.table = self.parked.pop(key)  # a table this process built for an earlier round
        if self.table is not None and self.table.key == key:
            self.table.uses += 1
            backend = self.table.backend
            backend.set_max_tokens(case.num_tokens)
            # same table, another kernel: swap the kernel, keep the filled table
            backend.set_kernel(backend.kernel_for(backend.device, case.kernel))
            return backend
        try:
            cls = get_backend(case.impl)
        except ValueError as exc:
            self.release_table()
            raise SkipCase(str(exc)) from exc
        # another path on the same filled rows (pinned_uva, then the CPU gather, the copy engines,
        # the hot cache): the old backend hands its table over, neither pinned nor filled again
        seed = TABLE_SEED_BASE + case.seed
        rows_key = (case.vocab_size, case.dim, case.dtype, case.host_alloc, seed, topo)
        shared = self.table if self.table is not None and self.table.rows_key == rows_key else None
        handed = shared.backend.hand_over_table() if shared is not None and cls.takes_table else None
        if self.park_tables:
            parked = self.parked.pop(("rows", rows_key), None) if handed is None and cls.takes_table else None
            if parked is not None:
                handed, shared = parked
            if handed is not None and shared is self.table:
                self.table.backend.close()  # handed over: nothing of the table is freed
                self.table = None
            self._park_current()
        else:
            self.release_table()
        in_host = cls.table_in_host_memory
        if case.host_alloc != "torch" and not in_host:
            raise SkipCase(f"host_alloc={case.host_alloc} applies to tables in pinned host memory; "
                           f"{case.impl} keeps its table elsewhere")
        shard_rows = -(-case.vocab_size // topo.etp)
        if handed is None:
            self._check_memory(case, cls, shard_rows * case.row_bytes)
        kwargs: dict[str, Any] = dict(
            dtype=case.dtype, num_heads=case.num_heads, max_tokens=case.num_tokens,
            groups=groups, device=self.device,
        )
        if case.kernel:
            kwargs["kernel"] = case.kernel
        if case.cache_rows:
            kwargs["cache_rows"] = case.cache_rows
        if case.stream_priority:
            kwargs["stream_priority"] = case.stream_priority
        if case.sm_limit:
            kwargs["sm_limit"] = case.sm_limit
        if case.gather_threads:
            kwargs["gather_threads"] = case.gather_threads
        if case.host_alloc != "torch":
            kwargs["host_alloc"] = case.host_alloc
        for k, v in case.extra:
            kwargs[k] = v
        if handed is not None:
            kwargs["table"] = handed
        free_before = host_alloc.mem_available_bytes()
        with annotate("table_fill", color="gray"):
            try:
                try:
                    backend = cls(case.vocab_size, case.dim, **kwargs)
                except BaseException:
                    if handed is not None:
                        handed.allocation.close()  # no backend took it: free it now
                    raise
            except TypeError as exc:
                raise SkipCase(f"{case.impl} does not accept this case's options: {exc}") from exc
            except NotImplementedError as exc:  # an option this path refuses (e.g. sm_limit)
                raise SkipCase(str(exc)) from exc
            except torch.OutOfMemoryError as exc:
                raise SkipCase(f"out of memory allocating the table: {exc}") from exc
            if handed is not None:  # filled already: its scale only (a scale belongs to the backend)
                if backend.format.quantized:
                    backend.set_scale(FP8_SCALE)
                backend.check_loaded()
                # one allocation: the cases on it get its figures and table_reused
                self.table = _Table(key, backend, seed, shared.cost, uses=shared.uses + 1, rows_key=rows_key)
                return backend
            fill_started = time.perf_counter()
            backend.fill_synthetic(seed, scale=FP8_SCALE if backend.format.quantized else None)
            backend.check_loaded()
            fill_s = time.perf_counter() - fill_started
        cost: dict[str, Any] = {}
        if backend.host_allocation is not None:
            cost = dict(host_alloc.allocation_fields(backend.host_allocation), table_fill_s=fill_s,
                        host_mem_free_before_bytes=free_before,
                        host_mem_free_after_bytes=host_alloc.mem_available_bytes())
        self.table = _Table(key, backend, seed, cost, uses=1, rows_key=rows_key)
        return backend

    def table_cost_fields(self) -> dict[str, Any]:
        """The record fields of the current table's host allocation (one allocation per
        table: a case that reuses it gets the same figures and ``table_reused``)."""
        if self.table is None or not self.table.cost:
            return {}
        return dict(self.table.cost, table_reused=self.table.uses > 1)

    def ids_for(self, case: Case, topo: Topology) -> torch.Tensor:
        """The case's ids where ``ids_on`` says: on the device, or in pinned host memory."""
        return self.id_sets_for(case, topo, 1)[0]

    def _ids_seed(self, case: Case, topo: Topology) -> int:
        dp_rank = topo.coords(self.rank).dp_rank if topo.world_size > 1 else 0
        return case.seed + _DP_SEED_STRIDE * dp_rank

    def _placed(self, case: Case, ids: torch.Tensor) -> torch.Tensor:
        """Ids where ``ids_on`` says: on the device, or in pinned host memory."""
        if case.ids_on != "host":
            return ids.to(self.device)
        return ids.pin_memory() if self.device.type == "cuda" else ids

    def warmup_ids_for(self, case: Case, topo: Topology) -> torch.Tensor:
        """Past traffic for a hot-row cache (``workload.warmup_ids``): never the measured ids."""
        try:
            ids = warmup_ids(case.ids, case.num_tokens, case.num_heads, case.vocab_size, seed=self._ids_seed(case, topo))
        except TraceUnavailable as exc:
            raise SkipCase(f"ids {case.ids}: {exc}") from exc
        return self._placed(case, ids)

    # ------------------------------------------------------------ one case
    def outcome(self, case: Case, policy) -> CaseResult:
        """The case run here, however it ends: a :class:`~ple_bench.record.CaseResult` with its
        status (a :class:`CaseOutcome` is its status and reason, any other exception a failure with
        its traceback) and the backend's declared facts, which go into the record
        (``record.build``).  What the worker pool and torchrun's ranks call."""
        try:
            return self.measure(case, policy)
        except CaseOutcome as exc:
            result = CaseResult(status=exc.status, reason=str(exc), measurement=dict(exc.fields))
        except Exception as exc:  # noqa: BLE001 - a failure is a record, with its traceback
            result = CaseResult(status="failed", reason=f"{type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc())
        result.lookup_mechanism, result.table_in_host_memory = backend_facts(case.impl)
        return result

    def run(self, case: Case, policy) -> dict[str, Any]:
        """The case measured here (raises :class:`SkipCase`, :class:`InvalidCase`, ...): what
        its worker reports, as one flat dict (:meth:`CaseResult.fields`)."""
        return self.measure(case, policy).fields()

    def measure(self, case: Case, policy) -> CaseResult:
        """The case measured here, status ok (raises :class:`SkipCase`, :class:`InvalidCase`, ...)."""
        topo = Topology(case.tp, case.etp, case.dp)
        if topo.world_size != self.world_size:
            raise SkipCase(f"needs {topo.world_size} ranks, this process group has {self.world_size}")
        groups = self.groups_for(topo)
        if case.kind == "serve":
            with annotate(f"case {case.case_id}", color="blue"):
                return self._run_serve(case, policy, topo, groups)
        with annotate(f"case {case.case_id}", color="blue"):
            backend = self.backend_for(case, topo, groups)
            if case.sm_limit:
                self._prepare_sm_limit(case, backend)
            id_sets = self.id_sets_for(case, topo, getattr(policy, "id_sets", 1))
            counts = [case.num_tokens] * topo.dp if topo.replicas > 1 else None
            if type(backend).warms_cache:
                # The hot-row cache is filled from *past* traffic (never the measured ids themselves,
                # which would hit 100% by construction).
                backend.warm_cache(self.warmup_ids_for(case, topo))
            with case_grid_cap(case, backend):
                if case.kind == "step":
                    measured = self._run_step(case, backend, id_sets, counts, policy, topo)
                else:
                    measured = self._run_lookup(case, backend, id_sets, counts, policy, topo)
            return self._result(case, backend, measured, id_sets)

    def _result(self, case: Case, backend, measured: dict[str, Any], id_sets) -> CaseResult:
        """A measured case's result: its measurement, the per-case ceiling entries taken out of it
        (they go to meta.json), the table's cost, the traffic, and the backend's declared facts."""
        cls = type(backend)
        mechanism = cls.lookup_mechanism()
        entries = measured.pop("random_row_ceiling_entry", None)
        return CaseResult(
            measurement=measured, lookup_mechanism=mechanism, table_in_host_memory=bool(cls.table_in_host_memory),
            kernel_ran=str(backend.kernel_name) if mechanism == "kernel" else None,
            table_cost=self.table_cost_fields(), traffic=_traffic_fields(case, id_sets),
            host_gather_ceiling=measured.pop("host_gather_ceiling", None),
            random_row_ceilings=list(entries) if isinstance(entries, list) else [entries] if entries else [])

    def _run_serve(self, case: Case, policy, topo: Topology, groups: Groups) -> CaseResult:
        """A served decode step (:mod:`ple_bench.run.serve`): the batch from the capacity rule, the
        table (reused across cases as for any case), the whole model's step checked and timed."""
        try:
            cls = get_backend(case.impl)
            placement = serve_mod.placement_of(cls)
        except (ValueError, NotImplementedError) as exc:
            raise SkipCase(str(exc)) from exc
        if topo.world_size > 1:
            raise SkipCase("a served step runs on one rank (tp = etp = dp = 1)")
        cap = serve_mod.serve_capacity(case, placement, self.device)
        batch = serve_mod.serve_batch(cap, case.batch_fraction)
        fields = serve_mod.capacity_fields(cap, placement, batch)
        if case.kv_dtype != "bf16":  # the capacity rule's batch only: labelled a prediction
            raise SkipCase(f"kv_dtype={case.kv_dtype}: no decode-attention kernel reads a {case.kv_dtype} KV cache "
                           f"here; the capacity rule's prediction: {cap.explain()}",
                           fields=dict(fields, kv_source="predicted"))
        if placement == "host" and case.table_bytes > host_memory_bytes():
            raise SkipCase(f"{cap.explain()}: the table ({case.table_bytes / 2**30:.1f} GiB) is larger than the "
                           f"host memory ({host_memory_bytes() / 2**30:.1f} GiB)", fields=fields)
        if cap.max_batch == 0:
            raise SkipCase(cap.explain(), fields=fields)
        # the path's axes follow the placement: the resident one-kernel gather with ids on the device,
        # or the posted flag path with the ids on the host (as a server's scheduler has them)
        run_case = replace(case, num_tokens=batch, ids_on="host" if placement == "host" else "device",
                           prefetch=placement == "host", graph="full" if self.device.type == "cuda" else "eager")
        backend = self.backend_for(run_case, topo, groups)
        id_sets = self.id_sets_for(run_case, topo, max(2, getattr(policy, "id_sets", 1)))
        self._gate(run_case, backend, id_sets, None)
        try:
            rec = serve_mod.run_serve_case(run_case, backend, id_sets, policy, self.device, cap=cap, batch=batch,
                                           placement=placement, table_seed=self.table.seed)
        except NotImplementedError as exc:
            raise SkipCase(f"{exc} ({cap.explain()})", fields=fields) from exc
        except torch.OutOfMemoryError as exc:
            gc.collect()  # the step's half-built tensors: the next case's batch needs their memory
            torch.cuda.empty_cache()
            raise SkipCase(f"out of memory at batch {batch}: {' '.join(str(exc).split())[:300]} "
                           f"({cap.explain()})", fields=fields) from exc
        except step_mod.StepMismatch as exc:
            raise InvalidCase(str(exc)) from exc
        rows = id_sets[0].numel()
        rec.update(rows=rows, bytes_moved=rows * case.row_bytes, row_bytes=case.row_bytes,
                   table_bytes=case.table_bytes)
        return self._result(run_case, backend, rec, id_sets)

    def _prepare_sm_limit(self, case: Case, backend) -> None:
        """``sm_limit`` > 0: the prefetch side stream on a green context of that many
        SMs, made now (before the gate).  SkipCase where that cannot be."""
        if not case.prefetch:
            raise SkipCase(f"sm_limit={case.sm_limit} limits the prefetch side stream; prefetch is off")
        if self.device.type != "cuda":
            raise SkipCase(f"sm_limit={case.sm_limit} needs CUDA (green contexts); functional mode has no streams")
        if "sm_limit" not in type(backend).side_stream_settings or backend.sm_limit != case.sm_limit:
            raise SkipCase(f"{case.impl} has no sm_limit setting for its side stream")
        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        if case.sm_limit > total:
            raise SkipCase(f"sm_limit={case.sm_limit}: this GPU has {total} SMs")
        try:
            backend.prepare_prefetch()
        except NotImplementedError as exc:  # GreenContextUnavailable: no way to make one here
            raise SkipCase(str(exc)) from exc

    def id_sets_for(self, case: Case, topo: Topology, n: int) -> list[torch.Tensor]:
        """``n`` id sets of the case's workload (``workload.make_id_sets``: independent draws of a
        synthetic law, successive steps of real text's streams)."""
        try:
            sets = make_id_sets(case.ids, case.num_tokens, case.num_heads, case.vocab_size, n,
                                seed=self._ids_seed(case, topo))
        except TraceUnavailable as exc:
            raise SkipCase(f"ids {case.ids}: {exc}") from exc
        return [self._placed(case, s) for s in sets]

    def lookup_fn(self, case: Case, backend, ids, counts):
        """A call that looks up the next id set (``ids`` is a tensor or a list of them)."""
        sets = ids if isinstance(ids, list) else [ids]
        turn = [0]

        def next_ids():
            cur = sets[turn[0] % len(sets)]
            turn[0] += 1
            return cur

        if case.prefetch:
            def fn():
                backend.start_prefetch(next_ids(), counts)
                return backend.finalize()
        else:
            def fn():
                return backend.lookup(next_ids(), counts)
        return fn

    def check_output(self, case: Case, backend, ids: torch.Tensor, out: torch.Tensor) -> None:
        ref = synthetic_rows(ids.reshape(-1), case.dim, self.table.seed, backend.storage_dtype)
        ref = ref.reshape(ids.shape[0], case.num_heads * case.dim).to(out.device)
        if tuple(out.shape) != tuple(ref.shape):
            raise InvalidCase(f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
        a = out.contiguous().view(torch.uint8)
        b = ref.contiguous().view(torch.uint8)
        bad = int((a != b).sum())
        if bad:
            raise InvalidCase(
                f"{bad} of {a.numel()} output bytes differ from the reference lookup"
            )

    def _gate(self, case, backend, ids, counts) -> None:
        """Every id set is looked up and checked; then the first again, with the
        previous output and any prefetch buffer poisoned."""
        sets = ids if isinstance(ids, list) else [ids]
        fn = self.lookup_fn(case, backend, sets, counts)
        out = None
        for cur in sets:
            out = fn()
            self.check_output(case, backend, cur, out)
        out.view(torch.uint8).fill_(0x7F)
        buffer = backend.prefetch_buffer
        if buffer is not None:
            buffer.view(torch.uint8).fill_(0x7F)
        if self.device.type == "cuda":  # the poison lands before the next lookup, whatever it waits for
            torch.cuda.synchronize(self.device)
        self.check_output(case, backend, sets[0], fn())

    def _run_lookup(self, case, backend, ids, counts, policy, topo) -> dict[str, Any]:
        if case.graph == "breakable":
            raise SkipCase("graph=breakable applies to kind=step cases (a lookup alone has no breaks)")
        id_sets = ids
        ids = id_sets[0]
        self._gate(case, backend, id_sets, counts)
        fn = self.lookup_fn(case, backend, id_sets, counts)
        # a CUDA graph bakes in its arguments: one graph per id set, replayed in turn, L2 flushed
        # before each sample as for the eager figure -- graph and eager time the same thing
        graph_fns = [self.lookup_fn(case, backend, s, counts) for s in id_sets]
        multi = topo.world_size > 1
        pol = lockstep(policy) if multi else policy
        host_sync = bool(type(backend).blocks_host)
        rec: dict[str, Any] = {}
        primary = None
        graph_meas = None
        if case.graph == "full" and host_sync:
            raise SkipCase(f"graph=full: {case.impl} does its lookup on the host, which a CUDA graph "
                           "cannot capture (it runs eagerly, or as an eager break of graph=breakable steps)")
        if case.graph == "full" or (policy.graph and not multi and self.device.type == "cuda"
                                    and not host_sync):
            if self.device.type != "cuda":
                raise SkipCase("graph=full needs CUDA (CPU functional mode runs eagerly)")
            if multi:
                raise SkipCase("graph replay of multi-rank lookups is not measured (collectives in capture)")
            try:
                graph_meas = m.measure_graph(graph_fns, device=self.device, policy=pol, label="lookup_graph",
                                             cold_l2=policy.cold_l2)
            except m.GraphCaptureError as exc:
                if case.graph == "full":
                    raise SkipCase(f"lookup cannot be captured in a CUDA graph: {exc}") from exc
        if case.graph == "full":
            primary = graph_meas
        else:
            primary = m.measure(fn, device=self.device, policy=pol, cold_l2=policy.cold_l2,
                                label="lookup", host_sync=host_sync)
            if policy.hot and policy.cold_l2:
                hot = m.measure(fn, device=self.device, policy=pol, cold_l2=False, label="lookup_hot",
                                host_sync=host_sync)
                rec["hot_median_ms"] = hot.stats()["median_ms"]
                rec["hot_samples_ms"] = hot.samples_ms
        if graph_meas is not None:
            rec["graph_median_ms"] = graph_meas.stats()["median_ms"]
            rec["graph_samples_ms"] = graph_meas.samples_ms
        rec.update(measurement_fields(primary))
        if multi:
            rec.update(self._collective_costs(case, backend, ids, counts, pol))
            rec.update(_slowest_rank(rec))
        rows = ids.numel()
        rec.update(rows=rows, bytes_moved=rows * case.row_bytes, row_bytes=case.row_bytes,
                   table_bytes=case.table_bytes, id_sets=len(id_sets),
                   graph_id_sets=len(id_sets) if graph_meas is not None else None,
                   graph_cold_l2=graph_meas.cold_l2 if graph_meas is not None else None)
        rec.update(self._path_stats(backend, fn, len(id_sets)))
        rec.update(sm_limit_fields(case, backend))
        rec.update(self._host_gather_share(case, backend, rows, rec.get("median_ms"), "pct_of_host_gather_ceiling",
                                           policy))
        if not multi:
            rec.update(self._random_row_share(case, backend, rows, policy))
        return rec

    def _random_row_share(self, case: Case, backend, rows: int, policy) -> dict[str, Any]:
        """For a lookup whose kernel reads the table itself (every path but the host
        paths): the random-row ceiling of this case's table, row size and id
        distribution (:func:`ple_bench.measure.ceilings.random_row_ceiling`), measured
        the first time a case needs it and cached per worker: on the tensor the kernel
        reads (device table or the pinned table's UVA view), with ids of the case's
        distribution over the shard's rows (``workload.make_ids``), timed as the case is;
        gathered in ascending id order where the backend's kernel reads its rows so
        (``backend.reads_sorted``: the sorted-order ceiling, key ending ``:sorted``)."""
        if type(backend).reads_ids_on_host or backend.weight is None:
            return {}
        order = "sorted" if backend.reads_sorted else "random"

        cpu = self.device.type != "cuda"
        in_host = bool(type(backend).table_in_host_memory)
        memory = "host" if cpu else "pinned" if in_host else "device"
        alloc = case.host_alloc if in_host and not cpu else "torch"
        ids = parse_ids_spec(case.ids).canonical
        valid = backend.shard.num_valid  # the shard's real rows (padding rows are never read)
        wanted = ceil.random_row_rows(rows, backend.row_bytes, case.num_heads, cpu=cpu)
        # the case's own row count: the plain gather of its batch (its latency floor), and the
        # case ran with it, so its buffers fit
        own = -(-max(rows, 1) // case.num_heads) * case.num_heads
        found: dict[int, dict[str, Any]] = {}
        for n in dict.fromkeys((own, wanted)):
            key = ceil.random_row_key(memory, backend.table_bytes, backend.row_bytes, ids, case.num_heads, n, alloc,
                                      order)
            if key in self.random_row_ceilings:
                found[n] = self.random_row_ceilings[key]
                continue
            try:
                sets = [make_ids(ids, n // case.num_heads, case.num_heads, valid,
                                 seed=RANDOM_ROW_SEED + 7919 * k, device=self.device)
                        for k in range(max(1, getattr(policy, "id_sets", 1)))]
                c = ceil.random_row_ceiling(
                    backend.table_for_kernel(), sets, self.device, memory=memory, policy=policy,
                    cold_l2=getattr(policy, "cold_l2", None), ids=ids, num_heads=case.num_heads,
                    table_bytes=backend.table_bytes, host_alloc=alloc, order=order)
            except torch.OutOfMemoryError:
                sets = None
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            self.random_row_ceilings[key] = found[n] = c
        if not found:
            return {}
        bandwidth = found.get(wanted) or found[own]
        out: dict[str, Any] = {"random_row_ceiling_entry": [dict(c) for c in found.values()],
                               "random_row_ceiling": bandwidth["key"], "random_row_ceiling_gbps": bandwidth["gbps"]}
        if own in found:
            out.update(random_row_ceiling_at_rows=found[own]["key"],
                       random_row_ceiling_at_rows_gbps=found[own]["gbps"])
        return out

    def _host_gather_share(self, case: Case, backend, rows: int, ms: float | None, key: str,
                           policy=None) -> dict[str, Any]:
        """For a path that gathers on the host: the host-gather ceiling of this
        table and row count (measured once per run and worker, timed as host-path
        lookups are: ``host_sync``, the case policy's L2 setting, see
        :func:`ple_bench.measure.host_gather_ceiling`) and ``ms``'s share of it."""
        if not type(backend).gathers_on_host or backend.weight is None:
            return {}  # copy engines: held against the host->device copy ceiling (record.choose_ceiling)

        ids = parse_ids_spec(case.ids).canonical
        ident = (backend.table_bytes, rows, backend.row_bytes, ids)
        if ident not in self.host_gather_ceilings:
            heads = max(1, case.num_heads)
            n = -(-max(rows, 1) // heads)
            sets = [make_ids(ids, n, heads, backend.shard.num_valid, seed=RANDOM_ROW_SEED + 104729 * k,
                             device="cpu").reshape(-1)[:rows]
                    for k in range(HOST_GATHER_ID_SETS)]
            self.host_gather_ceilings[ident] = host_gather_ceiling(
                backend.weight, rows, self.device, policy=policy, id_sets=sets, ids=ids,
                cold_l2=getattr(policy, "cold_l2", None) if policy is not None else None)
        ceiling = self.host_gather_ceilings[ident]
        out: dict[str, Any] = {"host_gather_ceiling": dict(ceiling),
                               "host_gather_ceiling_ms": ceiling["ms"],
                               "host_gather_ceiling_gather": ceiling.get("gather"),
                               "host_gather_ceiling_rows_per_s": ceiling["rows_per_s"],
                               "host_gather_ceiling_warm_ms": ceiling.get("warm_ms")}
        if ms:
            out[key] = 100.0 * ceiling["ms"] / ms
        return out

    def _path_stats(self, backend, fn, calls: int) -> dict[str, Any]:
        """``calls`` more (untimed) calls, one per id set, for what the path reports
        about itself: the CPU time of its own host threads per call and, for a
        cache, the hit rate over all of them."""
        out: dict[str, Any] = {}
        backend.reset_stats()
        before = backend.host_thread_s
        for _ in range(calls):
            fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out["host_thread_ms"] = (backend.host_thread_s - before) * 1e3 / calls
        stats = backend.stats()
        if "hit_rate" in stats:
            out["cache_hit_rate"] = stats["hit_rate"]
        if "gather_impl" in stats:
            out["gather_impl"] = stats["gather_impl"]
        return out

    def _collective_costs(self, case, backend, ids, counts, pol) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ids = backend.device_ids(ids)  # the collectives take device tensors
        slot = backend.slot_size(ids.shape[0], counts)
        if backend.topology.replicas > 1:
            g = m.measure(lambda: backend.gather_ids(ids, slot), device=self.device, policy=pol,
                          label="gather")
            out["gather_ms"] = g.stats()["median_ms"]
            out["gather_bytes"] = ids.numel() * ids.element_size() * backend.topology.replicas
        if backend.groups.etp_group is not None:
            rows = backend.local_lookup(backend.gather_ids(ids, slot))
            r = m.measure(lambda: backend.reduce_rows(rows), device=self.device, policy=pol, label="reduce")
            out["reduce_ms"] = r.stats()["median_ms"]
            nbytes = rows.numel() * rows.element_size()
            out["reduce_bytes"] = nbytes
            n = backend.topology.etp
            # bus bandwidth of a ring all-reduce: 2 (n-1)/n x bytes / time (nccl-tests' convention)
            out["reduce_busbw_gbps"] = 2 * (n - 1) / n * nbytes / (out["reduce_ms"] * 1e6)
        return out

    def _run_step(self, case, backend, ids, counts, policy, topo) -> dict[str, Any]:
        id_sets = ids
        ids = id_sets[0]
        self._gate(case, backend, id_sets, counts)
        # A resident step is the baseline of pinned steps on either timer (record.Peers picks the
        # one on the pinned step's timer): timed by CUDA events, it is also timed as synchronized
        # calls on the host clock, the timer of host-blocking paths and host ids.
        event_timed = (self.device.type == "cuda" and not type(backend).blocks_host
                       and case.ids_on != "host")
        # several id sets, copied into the step's static input in turn: fresh rows each step
        if len(id_sets) < 2:
            id_sets = self.id_sets_for(case, topo, 8)
        try:
            rec = step_mod.run_step_case(replace(case, grid_frac=1.0), backend, id_sets, counts, policy,
                                         self.device, table_seed=self.table.seed,
                                         host_sync_twin=case.impl == "device" and event_timed)
        except NotImplementedError as exc:
            raise SkipCase(str(exc)) from exc
        except step_mod.StepMismatch as exc:
            raise InvalidCase(str(exc)) from exc
        rec.update(self._path_stats(backend, self.lookup_fn(case, backend, id_sets, counts), len(id_sets)))
        if topo.world_size > 1:
            rec.update(_slowest_rank(rec))
        rows = ids.numel()
        rec.setdefault("rows", rows)
        rec.setdefault("bytes_moved", rows * case.row_bytes)
        rec.update(row_bytes=case.row_bytes, table_bytes=case.table_bytes)
        rec.update(self._host_gather_share(case, backend, rows, rec.get("lookup_ms"),
                                           "lookup_pct_of_host_gather_ceiling", policy))
        return rec


@contextlib.contextmanager
def case_grid_cap(case: Case, backend):
    """``grid_frac`` < 1 caps the lookup's programs at that share of the SMs: the
    backend's ``grid_cap`` for the case (kernels that take a grid cap only,
    ``supports_grid_cap``; the reference launches one program per id)."""
    if case.grid_frac == 1.0:
        yield
        return
    if not backend.supports_grid_cap:
        capped = tuple(k for k in kernel_names() if takes_grid_cap(get_kernel(k)))
        raise SkipCase(f"grid_frac={case.grid_frac} needs a kernel with a grid cap {capped}; "
                       f"{backend.kernel_name} launches one program per id")

    previous = backend.grid_cap
    backend.grid_cap = fast_kernels.max_programs_for_grid_frac(case.grid_frac, backend.device)
    try:
        yield
    finally:
        backend.grid_cap = previous


def _traffic_fields(case: Case, id_sets) -> dict[str, Any]:
    """What the traffic is: ``unique_rows_fraction`` from the ids looked up, and a real-text
    trace's provenance (``ids_trace``)."""
    # counted where the ids are (a sort on the GPU: milliseconds; np.unique over the eight
    # 524 288-id sets of a 32 768-token case took 1-2.5 s on the H200 host), the same count
    fields: dict[str, Any] = {"unique_rows_fraction": traces.batch_traffic(list(id_sets))}
    spec = parse_ids_spec(case.ids)
    if spec.kind == "text":
        fields["ids_trace"] = traces.load_trace(spec.corpus).description + (
            ", Engram tokenizer compression" if spec.lower else "")
    return fields


def _slowest_rank(rec: dict[str, Any]) -> dict[str, Any]:
    """Every rank measured; the case's time is the slowest rank's."""
    mine = rec.get("median_ms") if rec.get("median_ms") is not None else rec.get("step_ms")
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, rec.get("samples_ms"), rec.get("samples_throttled")))
    medians = [m for m, _, _ in everyone if m is not None]
    out: dict[str, Any] = {"rank_medians_ms": medians}
    if medians:
        worst = max(range(len(everyone)), key=lambda i: everyone[i][0] or -1)
        out["rank_spread_ms"] = max(medians) - min(medians)
        out["slowest_rank"] = worst
        if rec.get("median_ms") is not None:
            out["median_ms"] = everyone[worst][0]
            out["samples_ms"] = everyone[worst][1]
            out["samples_throttled"] = everyone[worst][2]  # the flags of those samples, not this rank's
    return out


def now() -> float:
    return time.perf_counter()
