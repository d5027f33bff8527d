"""GPU verification of ``pytest suites/`` (issue 6): suite cases as pytest-benchmark
benchmarks on ple_bench's engine, on CUDA.

Run from the repo root on a CUDA machine (about a minute on an H200)::

    PYTHONPATH=. python3 scripts/gpu/verify_pytest_suites.py

Checks (each prints PASS or FAIL with numbers):
 1. ``pytest suites/ --ple-suite smoke`` exits 0; every single-rank case ran,
    the decode-step graph cases (breakable, full) included; only multi-rank
    cases are skipped;
 2. every benchmark says timer=host+sync and engine_timer=cuda_event, mode=gpu;
 3. pytest-benchmark's host+sync median is not below the engine's CUDA-event
    median (x0.8 for noise): a host timer around completed GPU work cannot be
    shorter than the GPU work; both medians are printed per case;
 4. the lookup graph=full cases of ``default`` at 256 tokens (1 GiB table) run
    and time graph replays.
Exit status 0 only if every check passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ple_bench.suite import load_suite

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        FAILED.append(what)


def run_pytest(*args: str, json_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PLE_BENCH_FORCE_CPU", None)
    env["PYTHONPATH"] = "." + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "suites/", *args,
           f"--benchmark-json={json_path}", "--benchmark-columns=min,median,max,rounds"]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-6000:])
    print(proc.stderr[-3000:])
    return proc


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    tmp = Path(tempfile.mkdtemp(prefix="ple_pytest_suites-"))

    # 1-3: the smoke suite
    smoke = load_suite("smoke")
    single = {c.case_id for c in smoke.cases if c.world_size == 1}
    path = tmp / "smoke.json"
    proc = run_pytest("--ple-suite", "smoke", json_path=path)
    check(proc.returncode == 0, f"pytest suites/ --ple-suite smoke exit status {proc.returncode}")
    doc = json.loads(path.read_text()) if path.exists() else {"benchmarks": []}
    benches = {b["extra_info"]["case_id"]: b for b in doc["benchmarks"]}
    missing = sorted(single - set(benches))
    check(not missing, f"{len(benches)} of {len(single)} single-rank smoke cases timed; missing {missing}")
    graph_steps = [c.case_id for c in smoke.cases if c.kind == "step" and c.graph != "eager"]
    check(all(g in benches for g in graph_steps), f"graph step cases timed: {graph_steps}")
    bad_timer = [cid for cid, b in benches.items()
                 if (b["extra_info"].get("timer"), b["extra_info"].get("engine_timer"), b["extra_info"].get("mode"))
                 != ("host+sync", "cuda_event", "gpu")]
    check(not bad_timer, f"timer=host+sync, engine_timer=cuda_event, mode=gpu everywhere; wrong: {bad_timer}")
    print(f"{'case':<70} {'pytest median us':>17} {'engine median us':>17} {'ratio':>7}")
    too_fast = []
    for cid, b in sorted(benches.items()):
        pb_ms = b["stats"]["median"] * 1e3
        eng_ms = b["extra_info"].get("engine_median_ms") or float("nan")
        ratio = pb_ms / eng_ms if eng_ms else float("nan")
        print(f"{cid:<70} {pb_ms * 1e3:>17.2f} {eng_ms * 1e3:>17.2f} {ratio:>7.2f}")
        if not ratio >= 0.8:
            too_fast.append(cid)
    check(not too_fast, f"host+sync median >= 0.8 x engine CUDA-event median; violated by {too_fast}")

    # 4: lookup graph=full cases of the default suite (graph replay timed)
    default = load_suite("default")
    full = [c.case_id for c in default.cases
            if c.kind == "lookup" and c.graph == "full" and c.num_tokens == 256]
    path = tmp / "full.json"
    proc = run_pytest("--ple-suite", "default", "-k", " or ".join(full), json_path=path)
    doc = json.loads(path.read_text()) if path.exists() else {"benchmarks": []}
    timed = {b["extra_info"]["case_id"]: b["extra_info"].get("timed") for b in doc["benchmarks"]}
    check(proc.returncode == 0 and set(timed) == set(full)
          and set(timed.values()) == {"lookup graph replay"},
          f"default graph=full lookups timed as graph replays: {timed} (wanted {full})")

    print("ALL PASS" if not FAILED else f"{len(FAILED)} FAILED: {FAILED}")
    return 0 if not FAILED else 1


if __name__ == "__main__":
    sys.exit(main())
