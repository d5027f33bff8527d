"""The runner, as imported before it was split (issue 14.3); new code imports the modules:

* ``suite_loop`` -- the suite loop (order, dispatch, derive, record, resume, progress, report);
* ``provenance`` -- the run's ``meta.json`` (versions, machine, launch, ceilings);
* ``dispatch`` -- one case to its ranks: ple_bench's own worker pool, a fresh one after a failure;
* ``torchrun_protocol`` -- under torchrun: the ranks' agreement on each outcome and the recovery."""

from __future__ import annotations

from .dispatch import CaseDispatcher, case_record, torch_trace_name
from .env import gpu_count
from .provenance import REPO_ROOT, base_meta, git_commit, launch_info
from .suite_loop import (
    RunOptions, RunSummary, derive_record, order_cases, run_suite, select_cases, table_in_host_memory,
)
from .torchrun_protocol import TorchrunRanks

__all__ = ["CaseDispatcher", "REPO_ROOT", "RunOptions", "RunSummary", "TorchrunRanks", "base_meta", "case_record",
           "derive_record", "git_commit", "gpu_count", "launch_info", "order_cases", "run_suite", "select_cases",
           "table_in_host_memory", "torch_trace_name"]
