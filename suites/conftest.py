"""pytest entry to the suites: ``pytest suites/ [--ple-suite NAME]`` runs every case
of one suite as a pytest-benchmark benchmark, on ple_bench's own engine
(:class:`ple_bench.run.executor.CaseExecutor`) in this process.

This conftest owns the command-line options, the session objects (suite, timing
policy, executor) and the parametrization (one test per case, id = case_id);
``test_suite_cases.py`` holds the test itself.  See docs/pytest-benchmark.md.

Options:

* ``--ple-suite NAME|PATH``: the suite (default ``default`` with a CUDA GPU,
  ``smoke`` without).  Without a GPU a suite with ``functional_fallback`` is
  replaced by its fallback, as ``python -m ple_bench run`` does.
* ``--ple-rounds N`` / ``--ple-warmup-rounds N``: ``benchmark.pedantic``'s rounds
  (default: from the suite's timing policy; see :func:`default_rounds`) and warm-up
  rounds (default: none -- each case is warmed up as the engine warms up its
  measurements, the policy's ``warmup_ms`` of calls, at least one; see
  ple_bench/run/bench.py).

The repository's plain ``pytest`` does not come here (``testpaths = ["tests"]``);
name ``suites/`` explicitly.  The suite loader only reads ``*.toml`` files, so
these Python files do not disturb ``python -m ple_bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # ple_bench (and plug-in backends by import path) without an install
    sys.path.insert(0, str(REPO_ROOT))

CPU_DEFAULT_SUITE = "smoke"
GPU_DEFAULT_SUITE = "default"
#: at most this many pedantic rounds by default (each round syncs the device)
MAX_DEFAULT_ROUNDS = 100


def has_gpu() -> bool:
    """A CUDA GPU is usable (``PLE_BENCH_FORCE_CPU`` pretends there is none, as for the CLI)."""
    from ple_bench.env import gpu_available

    return gpu_available()


def pytest_addoption(parser):
    group = parser.getgroup("ple_bench", "ple_bench suites as pytest-benchmark benchmarks")
    group.addoption("--ple-suite", default=None, metavar="NAME|PATH",
                    help=f"suite to run (suites/<NAME>.toml or a .toml path); default: "
                         f"'{GPU_DEFAULT_SUITE}' with a CUDA GPU, '{CPU_DEFAULT_SUITE}' without")
    group.addoption("--ple-rounds", type=int, default=None, metavar="N",
                    help="benchmark.pedantic rounds per case (default: from the suite's timing policy)")
    group.addoption("--ple-warmup-rounds", type=int, default=None, metavar="N",
                    help="benchmark.pedantic warm-up rounds per case (default: the engine's warm-up, "
                         "the suite's warmup_ms of calls, at least one)")


class SuiteSession:
    """What every case test shares: the suite, its timing policy, the device and
    the executor (which keeps the last filled table, so adjacent cases reuse it)."""

    def __init__(self, config) -> None:
        from ple_bench.measure import TimingPolicy
        from ple_bench.spec.suite import SuiteError, load_suite

        self.gpu = has_gpu()
        requested = config.getoption("--ple-suite") or (GPU_DEFAULT_SUITE if self.gpu else CPU_DEFAULT_SUITE)
        self.note = ""
        try:
            suite = load_suite(requested)
            if not self.gpu and suite.functional_fallback:
                self.note = (f"no CUDA GPU: suite '{suite.name}' replaced by its functional fallback "
                             f"'{suite.functional_fallback}'")
                suite = load_suite(suite.functional_fallback)
            policy = TimingPolicy.from_dict(suite.timing or {})
        except (SuiteError, ValueError) as exc:
            raise pytest.UsageError(f"--ple-suite {requested}: {exc}") from exc
        self.suite = suite
        self.mode = "gpu" if self.gpu else "functional"
        self.policy = policy if self.gpu else policy.scaled_for_cpu()
        rounds = config.getoption("--ple-rounds")
        warmup = config.getoption("--ple-warmup-rounds")
        if rounds is not None and rounds < 1:
            raise pytest.UsageError("--ple-rounds must be at least 1")
        if warmup is not None and warmup < 0:
            raise pytest.UsageError("--ple-warmup-rounds must be >= 0")
        self.rounds = rounds if rounds is not None else default_rounds(self.policy)
        self.warmup_rounds = warmup  # None: the engine's warm-up (BenchTarget.warm_up)
        self._executor = None

    @property
    def cases(self):
        from ple_bench.run.loop import order_cases

        return order_cases(self.suite.cases)  # tables built once, resident step baselines first

    def executor(self):
        if self._executor is None:
            import torch

            from ple_bench.run.executor import CaseExecutor

            device = torch.device("cpu")
            if self.gpu:
                device = torch.device("cuda", torch.cuda.current_device())
                torch.cuda.set_device(device)
            self._executor = CaseExecutor(rank=0, world_size=1, device=device)
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.release_table()
            self._executor = None


def default_rounds(policy) -> int:
    """The policy's sample count, within [min_samples, min(max_samples, MAX_DEFAULT_ROUNDS)]."""
    return max(policy.min_samples, min(policy.max_samples, MAX_DEFAULT_ROUNDS))


def _session(config) -> SuiteSession:
    sess = getattr(config, "_ple_suite_session", None)
    if sess is None:
        sess = SuiteSession(config)
        config._ple_suite_session = sess
    return sess


def pytest_report_header(config):
    s = _session(config)
    warmup = (f"warmup_rounds={s.warmup_rounds}" if s.warmup_rounds is not None
              else f"warm-up as the engine's (warmup_ms={s.policy.warmup_ms:g})")
    lines = [f"ple_bench suite: {s.suite.name} ({s.suite.path}), {len(s.suite)} cases, {s.mode} mode, "
             f"pedantic rounds={s.rounds} {warmup}"]
    if s.note:
        lines.append(f"ple_bench: {s.note}")
    return lines


def pytest_generate_tests(metafunc):
    if "ple_case" in metafunc.fixturenames:
        cases = _session(metafunc.config).cases
        metafunc.parametrize("ple_case", cases, ids=[c.case_id for c in cases])


def pytest_unconfigure(config):
    sess = getattr(config, "_ple_suite_session", None)
    if sess is not None:
        sess.close()


@pytest.fixture(scope="session")
def ple_session(request) -> SuiteSession:
    return _session(request.config)
