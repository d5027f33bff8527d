"""``python -m ple_bench advise``: the verb's flags (:func:`add_advise_args`) and its two answers --
where the table should live and how it is looked up (:func:`run_advise`, the answer in
:mod:`ple_bench.advise.answer`), and what each placement serves (``--model``: :func:`run_model_advise`,
the answer in :mod:`ple_bench.advise.serving`).  Flags are checked here and exit 2 naming the flag;
the answers take plain values."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..advise.answer import (AdviseError, EXIT_BAD_USAGE, advise, compute_asked, format_short, format_text,
                             name_the_scope, records_for_compute_ask, records_for_ids, scoped_verdict, wanted_ids)
from ..advise.gpus import GpuError, get_gpu, gpu_names
from ..advise.html import write_advice_html
from ..advise.machine import Machine, MachineError, read_machine_file
from ..advise.model import build_model, load_runs
from ..advise.serving import ServingAdviseError, ServingAsk, advise_serving, format_serving_text
from ..advise.what_if import WhatIf, model_advice
from ..env import gpu_available
from ..verdict import FUNCTIONAL_TEXT, NO_VERDICT, is_functional
from ..serving.models import KV_DTYPES, MODELS, get_model
from ..units import DTYPE_BYTES, BadValue, parse_size


def add_advise_args(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--table-bytes", help="table size, e.g. 47.7GiB or 51200286720 (required without --model)")
    size.add_argument("--rows", type=int, help="table rows (vocabulary)")
    p.add_argument("--dim", type=int, help="elements per row (required without --model)")
    p.add_argument("--dtype", help="fp32 | fp16 | bf16 | fp8 (required without --model)")
    p.add_argument("--heads", type=int, help="rows per token (required without --model)")
    p.add_argument("--tokens", help="tokens per step, comma-separated (e.g. 64,256,512); required without --model")
    p.add_argument("--compute-us", type=float,
                   help="a matmul chain of this many microseconds between the lookup's start and its use "
                        "(the same as --compute us:N)")
    p.add_argument("--compute", metavar="KIND",
                   help="the compute between the lookup's start and its use: us:<microseconds> (the matmul "
                        "chain) or decoder:[<shape>:]<layers>x<context> (decoder layers over a KV cache of that "
                        "many tokens per sequence, shape default qwen3-8b); the model calibrates on that kind only")
    p.add_argument("--hbm-bytes", help="HBM the table may take (default: no limit); with --model: the GPU's HBM "
                                       "(default: the GPU the runs measured), e.g. 80GB")
    p.add_argument("--host-bytes", help="host memory the table may take (default: no limit)")
    p.add_argument("--runs", nargs="+", metavar="RUN_DIR",
                   help="run folders to read (docs/runs/*); without it, advise runs the few cases it needs")
    p.add_argument("--etp", type=int, default=1, help="what-if: an ETP group of N GPUs shares the table (tp 1)")
    p.add_argument("--nodes", type=int, default=1, help="what-if: the ETP group spans this many nodes")
    p.add_argument("--link-gbps", type=float, help="what-if: inter-node bandwidth per GPU, GB/s")
    p.add_argument("--link-latency-us", type=float, default=0.0, help="what-if: inter-node latency, us")
    p.add_argument("--host-cores", type=int, help="what-if: host cores for the host-gather paths")
    mach = p.add_argument_group("machine (what-if: another machine; default the one the runs measured)")
    mach.add_argument("--machine", metavar="FILE",
                      help="a machine description, TOML or JSON (.json), keys: " + ", ".join(Machine.KEYS)
                           + " (a [machine] table or top-level keys); the flags below override it")
    mach.add_argument("--h2d-gbps", type=float, help="host-to-device GB/s (e.g. 375 for a Grace Hopper's C2C)")
    mach.add_argument("--hbm-gbps", type=float, help="HBM read GB/s")
    mach.add_argument("--host-gather-rows-per-s", type=float, help="the host gather's row rate, rows/s")
    mach.add_argument("--sms", type=int, help="SMs the lookup kernels may use")
    mach.add_argument("--gpu-hbm-bytes", help="the GPU's HBM (the machine's; --hbm-bytes is the table's budget)")
    mach.add_argument("--gpu", metavar="NAME",
                      help="with --model: answer for this GPU (its memory as the card reports it, its datasheet "
                           "figures, each with its source; ple_bench/advise/gpus.toml): " + ", ".join(gpu_names()))
    p.add_argument("--html", metavar="PATH", help="also write the answer as an HTML page")
    p.add_argument("--results-dir", default="results", help="where a self-run (no --runs) stores its run")
    p.add_argument("--measure", choices=["few", "all"], default="few",
                   help="without --runs: measure only the cases no model settles (few: the posted host gather and "
                        "the UVA kernel with their resident steps, about a minute on one H200) or every path (all)")
    p.add_argument("--functional-check", action="store_true",
                   help="without a GPU and without --runs: run advise's handful of cases in functional mode "
                        "(CPU) to check the code paths; ranks nothing (without it advise refuses there, exit 2)")
    p.add_argument("--graph", choices=["replayed", "any"], default="any",
                   help="rank every stable pinned step by its step time (default), or only graph-replayed ones "
                        "where the runs have them")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text (its 'verdicts': the "
                                                       "verdict.json entries of the asked shape)")
    p.add_argument("--all", action="store_true",
                   help="print every row (every measured step, the model's every prediction); default: per token "
                        "count the HBM row and the best row of each pinned path, one ranking per timer")
    serve = p.add_argument_group("serving (--model): tokens/s and TPOT per placement at the batch each holds")
    serve.add_argument("--model", help="a model preset (ple_bench.serving.models: e.g. qwen3-8b, qwen3-32b, tiny): "
                                       "answer what the placement buys in tokens/s and TPOT, from serve records "
                                       "where the runs have them, else predicted")
    serve.add_argument("--context", type=int, help="with --model: tokens of context per sequence (e.g. 8192)")
    serve.add_argument("--kv-dtype", default="bf16", help="with --model: the KV cache's dtype (bf16 | fp8)")
    serve.add_argument("--tpot-ms", type=float, help="with --model: the TPOT target, ms per output token "
                                                      "(default 30)")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                       help="with --model: the share of HBM the server may use (default 0.90, as serving engines)")
    p.add_argument("--ids", help="the traffic the answer is for: only records of this id workload "
                                 "(e.g. text:code, zipf:1.1, uniform; default: every workload in the runs)")


def _size(name: str, value: Any) -> int:
    """``--name``'s size in bytes ("47.7GiB" rounds to whole bytes here: a suite wants them exact)."""
    try:
        return parse_size(str(value), exact=False)
    except BadValue as exc:
        raise AdviseError(f"--{name}: {exc} (e.g. 47.7GiB, 200GB, 51200286720)") from None


#: where advise --model reads runs when none are given (the repository's archive)
ARCHIVE = "docs/runs"
#: the serving suite's table (suites/serving.toml: Qwen4Exp's PLE shape), the default of advise --model
DEFAULT_SERVING_TABLE = {"rows": 320001536, "dim": 160, "dtype": "fp8", "heads": 16}


def _serving_table(args: argparse.Namespace, records: list[dict[str, Any]],
                   model: str) -> tuple[int, int, str, int, str]:
    """The table ``advise --model`` answers for: the one asked (--table-bytes/--rows, --dim, --dtype,
    --heads); where none is asked, the table of the runs' serve records of this model (the most
    measured), else the serving suite's; the words say which.  AdviseError naming the flag."""
    asked = {"dim": args.dim, "dtype": args.dtype, "heads": args.heads}
    size_given = args.table_bytes is not None or args.rows is not None
    if not size_given and all(v is None for v in asked.values()):
        shapes: dict[tuple, int] = {}
        for r in records:
            if r.get("kind") == "serve" and r.get("model") == model and r.get("status") == "ok":
                key = (int(r.get("table_bytes") or 0), int(r.get("dim") or 0), str(r.get("dtype")),
                       int(r.get("num_heads") or 0))
                if all(key) and key[2] in DTYPE_BYTES:
                    shapes[key] = shapes.get(key, 0) + 1
        if shapes:
            (table, dim, dtype, heads), n = max(shapes.items(), key=lambda kv: kv[1])
            return table, dim, dtype, heads, (f"table: none asked; the runs' serve records' table, {table / 2**30:.1f} "
                                              f"GiB of {dim} x {dtype}, {heads} heads ({n} records; --table-bytes, "
                                              "--dim, --dtype, --heads for another)")
        d = DEFAULT_SERVING_TABLE
        table = d["rows"] * d["dim"] * DTYPE_BYTES[d["dtype"]]
        return table, d["dim"], d["dtype"], d["heads"], (
            f"table: none asked; the serving suite's, {table / 2**30:.1f} GiB of {d['dim']} x {d['dtype']}, "
            f"{d['heads']} heads (--table-bytes, --dim, --dtype, --heads for another)")
    missing = [f"--{k}" for k, v in asked.items() if v is None] + ([] if size_given else ["--table-bytes or --rows"])
    if missing:
        raise AdviseError(f"{', '.join(missing)}: give the whole table (--table-bytes or --rows, --dim, --dtype, "
                          "--heads), or none of it for the runs' table")
    if args.dtype not in DTYPE_BYTES:
        raise AdviseError(f"--dtype: unknown {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    for name in ("dim", "heads"):
        if getattr(args, name) < 1:
            raise AdviseError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.rows is not None and args.rows < 1:
        raise AdviseError(f"--rows: the table must have at least one row, got {args.rows}")
    table = _size("table-bytes", args.table_bytes) if args.table_bytes else args.rows * args.dim * DTYPE_BYTES[args.dtype]
    return table, args.dim, args.dtype, args.heads, ""


def run_model_advise(args: argparse.Namespace) -> int:
    """``advise --model``: the serving answer (:mod:`ple_bench.advise.serving`)."""
    try:
        try:
            model = get_model(args.model)
        except ValueError as exc:
            raise AdviseError(f"--model: {exc}") from None
        if args.context is None or args.context < 1:
            raise AdviseError(f"--context: tokens of context per sequence, >= 1, are needed with --model "
                              f"(got {args.context})")
        if args.kv_dtype not in KV_DTYPES:
            raise AdviseError(f"--kv-dtype: unknown {args.kv_dtype!r}; allowed: {', '.join(KV_DTYPES)}")
        gpu = get_gpu_or_exit(args.gpu) if args.gpu else None
        if args.tpot_ms is not None and args.tpot_ms <= 0:
            raise AdviseError(f"--tpot-ms: must be positive, got {args.tpot_ms}")
        if not 0 < args.gpu_memory_utilization <= 1:
            raise AdviseError(f"--gpu-memory-utilization: a share in (0, 1], got {args.gpu_memory_utilization}")
        if args.etp < 1:
            raise AdviseError(f"--etp: must be >= 1, got {args.etp}")
        for flag in ("hbm_gbps", "h2d_gbps"):
            if getattr(args, flag, None) is not None and getattr(args, flag) <= 0:
                raise AdviseError(f"--{flag.replace('_', '-')}: must be positive, got {getattr(args, flag)}")
        if args.html:
            raise AdviseError("--html: the serving answer (--model) has no page of its own yet; the run's report "
                              "leads with it (python -m ple_bench report RUN_DIR)")
        runs = list(args.runs or [])
        runs_words = ""
        if not runs:
            runs = sorted(str(d) for d in Path(ARCHIVE).glob("2*") if (d / "meta.json").exists())
            if not runs:
                raise AdviseError("--runs: --model answers from stored runs (a serving run measures it: python -m "
                                  "ple_bench run --suite serving; then advise --model ... --runs results/RUN_DIR)")
            runs_words = f"runs: the {len(runs)} archived runs in {ARCHIVE}/ (--runs RUN_DIR ... for yours)"
        missing = [d for d in runs if not (Path(d) / "meta.json").exists()]
        if missing:
            raise AdviseError(f"--runs: not a run folder (no meta.json): {', '.join(missing)}")
        records, metas = load_runs(runs)
        table, dim, dtype, heads, table_words = _serving_table(args, records, model.name)
        ask = ServingAsk(model=model, context_len=args.context, kv_dtype=args.kv_dtype, table_bytes=table,
                         dim=dim, dtype=dtype, heads=heads,
                         hbm_bytes=_size("hbm-bytes", args.hbm_bytes) if args.hbm_bytes else None,
                         host_bytes=_size("host-bytes", args.host_bytes) if args.host_bytes else None,
                         etp=args.etp, tpot_ms=args.tpot_ms, gpu_memory_utilization=args.gpu_memory_utilization,
                         gpu=gpu, hbm_read_gbps=getattr(args, "hbm_gbps", None), h2d_gbps=getattr(args, "h2d_gbps", None),
                         table_words="; ".join(w for w in (table_words, runs_words) if w))
        advice = advise_serving(ask, records, metas, MODELS)
    except (AdviseError, ServingAdviseError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    print(json.dumps(advice.to_json(), indent=1) if args.json else format_serving_text(advice))
    return 0


MACHINE_FLAGS = (("h2d_gbps", "--h2d-gbps"), ("hbm_read_gbps", "--hbm-gbps"),
                 ("host_gather_rows_per_s", "--host-gather-rows-per-s"), ("sms", "--sms"))


def machine_asked(args: argparse.Namespace, measured: Machine) -> Machine:
    """The machine to predict for: the measured one, then ``--machine FILE``'s keys, then the
    flags, each figure marked given by where it came from; AdviseError naming the file / key / flag."""
    m = measured
    try:
        if getattr(args, "machine", None):
            m = m.given(f"--machine {args.machine}", **read_machine_file(args.machine))
        for key, flag in MACHINE_FLAGS:
            value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
            if value is not None:
                m = m.given(flag, **{key: value})
        if getattr(args, "gpu_hbm_bytes", None):
            try:
                hbm = parse_size(str(args.gpu_hbm_bytes), exact=False)
            except BadValue as exc:
                raise AdviseError(f"--gpu-hbm-bytes: {exc}") from None
            m = m.given("--gpu-hbm-bytes", hbm_bytes=hbm)
        if args.host_cores is not None:
            m = m.given("--host-cores", host_cores=args.host_cores)
    except MachineError as exc:
        raise AdviseError(str(exc)) from None
    return m


def get_gpu_or_exit(name: str):
    """The preset ``--gpu NAME``; AdviseError naming the flag and listing the presets."""
    try:
        return get_gpu(name)
    except GpuError as exc:
        raise AdviseError(str(exc)) from None


def run_advise(args: argparse.Namespace) -> int:
    if getattr(args, "model", None):
        return run_model_advise(args)
    try:
        missing = [f for f, v in (("--table-bytes or --rows", args.table_bytes or args.rows), ("--dim", args.dim),
                                  ("--dtype", args.dtype), ("--heads", args.heads)) if v is None]
        if missing:
            raise AdviseError(f"{', '.join(missing)}: required for a decode step's answer (or --model for the "
                              "serving answer)")
        if not args.tokens:
            raise AdviseError("--tokens: give the tokens per step (e.g. 64,256,512), or --model for the serving answer")
        if getattr(args, "gpu", None):
            get_gpu_or_exit(args.gpu)  # a bad name names the flag first
            raise AdviseError("--gpu: answers --model's serving question; a decode step's answer on another "
                              "machine takes --machine FILE or --h2d-gbps, --hbm-gbps, --sms, --gpu-hbm-bytes")
        def size(name, value):  # "47.7GiB" rounds to whole bytes here (a suite wants them exact)
            try:
                return parse_size(str(value), exact=False)
            except BadValue as exc:
                raise AdviseError(f"--{name}: {exc} (e.g. 47.7GiB, 200GB, 51200286720)") from None

        try:
            tokens = [int(t) for t in str(args.tokens).split(",") if t.strip()]
        except ValueError:
            raise AdviseError(f"--tokens: {args.tokens!r} is not a comma-separated list of integers") from None
        if not tokens or any(t < 1 for t in tokens):
            raise AdviseError(f"--tokens: give one or more positive token counts per step, got {args.tokens!r}")
        if args.dtype not in DTYPE_BYTES:
            raise AdviseError(f"--dtype: unknown {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
        if args.rows is not None and args.rows < 1:
            raise AdviseError(f"--rows: the table must have at least one row, got {args.rows}")
        for name in ("dim", "heads"):
            if getattr(args, name) < 1:
                raise AdviseError(f"--{name}: must be >= 1, got {getattr(args, name)}")
        row_bytes = args.dim * DTYPE_BYTES.get(args.dtype, 1)
        table = size("table-bytes", args.table_bytes) if args.table_bytes else args.rows * row_bytes
        if args.etp < 1 or args.nodes < 1 or args.etp % args.nodes:
            raise AdviseError(f"--etp / --nodes: an ETP group of {args.etp} over {args.nodes} nodes is not possible "
                              "(both >= 1, the group split evenly over the nodes)")
        if args.nodes > 1 and not args.link_gbps:
            raise AdviseError("--link-gbps: an ETP group across nodes needs the inter-node bandwidth")
        if args.link_gbps is not None and args.link_gbps <= 0:
            raise AdviseError(f"--link-gbps: must be positive, got {args.link_gbps}")
        if args.link_latency_us < 0:
            raise AdviseError(f"--link-latency-us: must be >= 0, got {args.link_latency_us}")
        if args.host_cores is not None and args.host_cores < 1:
            raise AdviseError(f"--host-cores: must be >= 1, got {args.host_cores}")
        ask = compute_asked(args)  # sets args.compute_us (0 for decoder layers: their time is measured)
        machine_asked(args, Machine())  # a bad machine file, key or flag fails before any self-run
        if args.ids is not None:
            wanted_ids(args.ids)  # a bad spec fails before any self-run
        runs = args.runs
        if runs and args.functional_check:
            raise AdviseError("--functional-check runs advise's own cases: not with --runs")
        if not runs and ask.kind != "matmul":
            raise AdviseError(f"--compute {args.compute}: advise runs its own cases for the matmul chain only; "
                              "give --runs with a decoder run (python -m ple_bench run --suite decoder)")
        if not runs:
            # a self-run measures: the engine (and torch) load only then, so advise --runs does not
            from ..advise.self_run import NO_GPU, functional_case_count, self_run

            if not gpu_available() and not args.functional_check:
                raise AdviseError(NO_GPU.format(n=functional_case_count(args, tokens)))
            runs = self_run(args, table, tokens)
            if isinstance(runs, int):
                return runs
        missing = [d for d in runs if not (Path(d) / "meta.json").exists()]
        if missing:
            raise AdviseError(f"--runs: not a run folder (no meta.json): {', '.join(missing)}")
        hbm = size("hbm-bytes", args.hbm_bytes) if args.hbm_bytes else None
        host = size("host-bytes", args.host_bytes) if args.host_bytes else None
        if hbm is not None and host is not None and table / args.etp > hbm and table / args.nodes > host:
            raise AdviseError(f"the table ({table / 2**30:.1f} GiB) fits neither the HBM budget "
                              f"({hbm / 2**30:.1f} GiB per GPU, ETP {args.etp}) nor the host budget "
                              f"({host / 2**30:.1f} GiB per node)")

        records, metas = load_runs(runs)
        if is_functional(records):
            raise AdviseError(f"{FUNCTIONAL_TEXT}: the runs given are functional (CPU) runs, whose times are the "
                              "CPU's; give GPU runs (--runs RUN_DIR ..., e.g. docs/runs/*)")
        records = records_for_ids(records, args.ids)
        records, measured_ask, compute_notes = records_for_compute_ask(records, ask)
        steps = [r for r in records if r.get("status") == "ok" and r.get("kind") == "step"
                 and r.get("mode", "gpu") != "functional"]
        advice = advise(table_bytes=table, dim=args.dim, dtype=args.dtype, heads=args.heads, tokens=tokens,
                        compute_us=args.compute_us, records=steps,
                        hbm_bytes=hbm if args.etp == 1 else None, host_bytes=host if args.nodes == 1 else None,
                        graph_modes=args.graph,
                        ids=str(steps[0].get("ids")) if args.ids and steps else None)  # as stored
        name_the_scope(advice, ask, measured_ask, compute_notes)
        model = build_model(records, metas)
        if model.fits:
            target = machine_asked(args, model.rates.machine)
            host_cores = args.host_cores or (target.host_cores if "given" in target.sources.get("host_cores", "")
                                             else None)
            w = WhatIf(etp=args.etp, nodes=args.nodes, link_gbps=args.link_gbps,
                       link_latency_us=args.link_latency_us, host_cores=host_cores,
                       machine=target if model.rates.machine.differs(target) else None)
            if args.etp > 1 and model.rates.reduce_busbw_gbps is None:
                raise AdviseError("--etp: no all-reduce was measured in the runs given (add a topology run: "
                                  "python -m ple_bench run --suite topology on 2+ GPUs)")
            # another GPU's memory bounds the resident table where no --hbm-bytes budget was given
            gpu_hbm = target.hbm_bytes if "given" in target.sources.get("hbm_bytes", "") else None
            advice.model = model_advice(model, table_bytes=table, row_bytes=row_bytes, heads=args.heads,
                                        tokens=tokens, compute_us=args.compute_us, w=w, hbm_bytes=hbm or gpu_hbm,
                                        host_bytes=host, graph_modes=args.graph,
                                        compute_words=measured_ask.label if ask.kind == "decoder" else None,
                                        ids=advice.ids or None)  # the traffic the answer holds for
            # never a predicted figure in the headline where a measured one exists: the model's verdict
            # leads only where nothing was measured at the asked shape, or a what-if was asked
            asked_what_if = args.etp > 1 or args.nodes > 1 or host_cores is not None or w.machine is not None
            if asked_what_if or all(a.verdict == NO_VERDICT for a in advice.answers):
                advice.measured_verdict, advice.verdict = advice.verdict, advice.model.verdict
        scoped_verdict(advice)
        if args.html:
            write_advice_html(advice, args, Path(args.html))
    except AdviseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    if args.json:
        print(json.dumps(advice.to_json(), indent=1))
    else:
        print(format_text(advice) if getattr(args, "all", False) else format_short(advice))
    return 0


main = run_advise


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("advise", help="where should the table live, and how looked up: ranked from measured runs")
    add_advise_args(p)
    p.set_defaults(func=main)
    return p
