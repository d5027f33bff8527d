"""What real traffic does to a PLE / Engram table, beside the synthetic laws (CPU only).

For each id law (real text through Engram's hash, Zipf 1.1 / 1.2, uniform) on the 32 GiB and
47.7 GiB tables at dim 128 and 256 bf16 (16 heads), prints markdown tables of

* the unique-rows fraction per batch (distinct rows / rows, median over 8 successive batches) at
  64 / 256 / 512 decode tokens and 2 K / 8 K prefill tokens;
* the hit rate of a static LFU hot-row cache of 1 %, 5 %, 10 % of the rows, learned on the
  warm-up part (text: the warm-up documents, never measured; synthetic: an independent draw of
  as many tokens), measured on 8 batches of 256 decode tokens and of 8 K prefill tokens;

and draws both against batch / cache size (``--plot PNG``).  Public API only:
``ple_bench.workload`` (make_id_sets, make_ids, warmup_ids' constants) and ``ple_bench.traces``.

    PYTHONPATH=. python scripts/traffic_stats.py --plot docs/traffic.png > /tmp/traffic.md
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ple_bench import traces, workload

GIB = 1024 ** 3
TABLES = {"32 GiB": 32 * GIB, "47.7 GiB": 320_001_536 * 160}  # the suites' two tables, in bytes
DIMS_BF16 = (128, 256)
HEADS = 16
TOKENS = (64, 256, 512, 2048, 8192)
HIT_TOKENS = (256, 8192)
CACHE_SHARES = (0.01, 0.05, 0.10)
N_SETS = 8
SYNTHETIC_WARMUP_TOKENS = 200_000  # about the code corpus's warm-up region


def _laws(names: str) -> list[str]:
    return [s.strip() for s in names.split(",") if s.strip()]


def warmup(law: str, rows: int) -> np.ndarray:
    spec = workload.parse_ids_spec(law)
    if spec.kind == "text":
        return traces.text_warmup_ids(spec.corpus, spec.lower, 256, HEADS, rows, None)
    return workload.make_ids(law, SYNTHETIC_WARMUP_TOKENS, HEADS, rows,
                             seed=workload.WARMUP_SEED_OFFSET).numpy()


def stats(laws: list[str]) -> tuple[list[dict], list[dict]]:
    unique_rows, hit_rows = [], []
    for table, nbytes in TABLES.items():
        for dim in DIMS_BF16:
            rows = nbytes // (dim * 2)
            for law in laws:
                t0 = time.time()
                sets = {n: [s.numpy() for s in workload.make_id_sets(law, n, HEADS, rows, N_SETS, seed=1)]
                        for n in TOKENS}
                for n in TOKENS:
                    unique_rows.append(dict(table=table, dim=dim, law=law, tokens=n,
                                            unique=traces.batch_traffic(sets[n])))
                warm = warmup(law, rows)
                for share in CACHE_SHARES:
                    for n in HIT_TOKENS:
                        hit_rows.append(dict(table=table, dim=dim, law=law, tokens=n, cache=share,
                                             warm_tokens=warm.shape[0],
                                             hit=traces.hot_cache_hit_rate(warm, sets[n], int(share * rows))))
                print(f"  {table} dim {dim} {law}: {time.time() - t0:.1f} s", file=sys.stderr)
    return unique_rows, hit_rows


def markdown(unique_rows: list[dict], hit_rows: list[dict]) -> str:
    import pandas as pd

    out = []
    u = pd.DataFrame(unique_rows).pivot_table(index=["table", "dim", "law"], columns="tokens", values="unique",
                                              sort=False)
    out.append("Unique rows / rows per batch (median of 8 successive batches; decode <= 512 tokens, "
               "prefill above)\n")
    out.append("| table | dim | ids | " + " | ".join(f"{n} tok" for n in u.columns) + " |")
    out.append("|---|---|---|" + "---|" * len(u.columns))
    for (table, dim, law), r in u.iterrows():
        out.append(f"| {table} | {dim} | {law} | " + " | ".join(f"{v:.3f}" for v in r) + " |")
    h = pd.DataFrame(hit_rows)
    warm = h.groupby("law", sort=False).warm_tokens.first()
    h = h.pivot_table(index=["table", "dim", "law"], columns=["tokens", "cache"], values="hit", sort=False)
    out.append("\nHit rate of a static LFU cache learned on the warm-up part (text: other documents; "
               "synthetic: an independent draw)\n")
    cols = list(h.columns)
    out.append("| table | dim | ids | " + " | ".join(f"{n} tok, {c:.0%}" for n, c in cols) + " |")
    out.append("|---|---|---|" + "---|" * len(cols))
    for (table, dim, law), r in h.iterrows():
        out.append(f"| {table} | {dim} | {law} | " + " | ".join(f"{v:.3f}" for v in r) + " |")
    out.append("\nWarm-up tokens: " + ", ".join(f"{law} {n}" for law, n in warm.items()))
    return "\n".join(out)


def plot(unique_rows: list[dict], hit_rows: list[dict], path: str, table: str = "47.7 GiB", dim: int = 128) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    u = pd.DataFrame(unique_rows).query("table == @table and dim == @dim")
    h = pd.DataFrame(hit_rows).query("table == @table and dim == @dim and tokens == 256")
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    for law, g in u.groupby("law", sort=False):
        style = "-o" if law.startswith("text") else "--s"
        a.plot(g.tokens, g.unique, style, label=law, ms=4)
    for law, g in h.groupby("law", sort=False):
        style = "-o" if law.startswith("text") else "--s"
        b.plot(100 * g.cache, g.hit, style, label=law, ms=4)
    a.set(xscale="log", xlabel="tokens per batch (decode <= 512, prefill above)", ylabel="unique rows / rows",
          title=f"unique rows per batch, {table} dim {dim}")
    a.set_xticks(list(TOKENS), [str(n) for n in TOKENS])
    b.set(xlabel="cache size (% of rows)", ylabel="hit rate", title="static LFU hot cache, 256-token decode")
    b.legend(fontsize=7, loc="upper left")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", default="text:code,text:docs,text:prose,text:code+lower,zipf:1.1,zipf:1.2,uniform",
                   help="comma-separated id laws (default: %(default)s)")
    p.add_argument("--plot", metavar="PNG", help="write the plot here")
    args = p.parse_args(argv)
    try:
        laws = [workload.parse_ids_spec(s).canonical for s in _laws(args.ids)]
    except ValueError as exc:
        print(f"error: --ids: {exc}", file=sys.stderr)
        return 2
    try:
        unique_rows, hit_rows = stats(laws)
    except traces.TraceUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(unique_rows, hit_rows))
    if args.plot:
        plot(unique_rows, hit_rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
