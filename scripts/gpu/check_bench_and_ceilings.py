"""Print what shows the pytest-benchmark bridge and the sorted random-row ceiling at work on a GPU.

    python3 scripts/gpu/check_bench_and_ceilings.py RUNS_DIR PYTEST_BASETEMP

RUNS_DIR: a results folder holding a run of the default suite's dedup_triton and triton_tuned lookups
at 4096 tokens on the 1 GiB table (each record's ceiling, its share, and meta.json's random-row
ceilings: a sorted-read kernel is held against the same rows gathered sorted). PYTEST_BASETEMP: the
--basetemp of `pytest -m gpu tests/gpu/test_pytest_suites_gpu.py` (each host-sync or step benchmark:
the bridge's median beside the engine's, the engine's first and last samples)."""

from __future__ import annotations

import glob
import json
import sys


def runs(folder: str) -> None:
    for path in glob.glob(f"{folder}/*/records.jsonl"):
        for line in open(path):
            r = json.loads(line)
            print(r["case_id"][:62], r["status"], r.get("kernel_ran"), "%.4f" % (r.get("median_ms") or 0),
                  r.get("ceiling"), "%.1f%%" % (r.get("pct_of_ceiling") or 0), r.get("ceiling_exceeded"),
                  r.get("random_row_ceiling_at_rows"))
    for path in glob.glob(f"{folder}/*/meta.json"):
        for key, e in sorted(json.load(open(path))["ceilings"]["random_row"].items()):
            print(key, "%.4f ms" % e["ms"], "%.2f GB/s" % e["gbps"])


def bench(basetemp: str) -> None:
    for path in glob.glob(f"{basetemp}/*/bench.json"):
        for b in json.load(open(path))["benchmarks"]:
            info = b["extra_info"]
            samples = info.get("engine_samples_ms") or [0]
            if info.get("engine_timer") == "host_sync" or info.get("kind") == "step":
                bridge = b["stats"]["median"] * 1e3
                print(info["case_id"][:66], info.get("engine_timer"),
                      "bridge %.3f engine %.3f ratio %.2f warm %s" % (bridge, info["engine_median_ms"],
                                                                      bridge / info["engine_median_ms"],
                                                                      info.get("warmup_calls")),
                      "first", [round(x, 3) for x in samples[:4]], "last", [round(x, 3) for x in samples[-4:]])


if __name__ == "__main__":
    runs(sys.argv[1])
    bench(sys.argv[2])
