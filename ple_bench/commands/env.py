"""``env``: what this machine can run, and why not."""

from __future__ import annotations

import argparse
import shutil

from ..env import FORCE_CPU_ENV, force_cpu, gpu_available, gpu_count


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("env", help="what this machine can run, and why not")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see commands/__init__.py)
    import torch

    from .. import annotate
    from ..backends.cuda.uva import uva_available
    lines: list[tuple[str, str]] = []
    gpu = gpu_available()
    lines.append(("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"))
    try:
        import triton  # reported, not required: `env` says when it is missing

        lines.append(("triton", triton.__version__ + ("" if gpu else " (CPU: kernels run under the interpreter)")))
    except Exception as exc:  # noqa: BLE001
        lines.append(("triton", f"missing: {exc}"))
    if gpu:
        n = gpu_count()
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
        lines.append(("GPU", f"{n}: {names}"))
    elif force_cpu():
        lines.append(("GPU", f"forced off ({FORCE_CPU_ENV} is set): runs are functional (CPU, host timer)"))
    else:
        lines.append(("GPU", "none: runs are functional (CPU, host timer); GPU-only cases are skipped"))

    ok, why = uva_available()
    lines.append(("UVA (pinned_uva backend)", "yes" if ok else f"no: {why}; pinned_uva runs in functional mode"))
    lines.append(("multi-rank", "NCCL (one GPU per rank)" if gpu else "gloo on CPU processes"))
    lines.append(("NVTX", "nvtx package present (domain ple_bench)" if annotate.available()
                  else "nvtx package missing: ranges are no-ops"))
    for tool in ("ncu", "nsys"):
        path = shutil.which(tool)
        lines.append((tool, path or "not on PATH"))
    try:
        import pynvml  # optional: NVML clocks

        pynvml.nvmlInit()
        lines.append(("NVML clocks", f"driver {pynvml.nvmlSystemGetDriverVersion()}"))
    except Exception as exc:  # noqa: BLE001
        lines.append(("NVML clocks", f"unavailable: {type(exc).__name__}"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    lines.append(("chromium (report checks)", chromium or "not installed"))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    return 0
