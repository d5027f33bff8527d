"""One answer on every screen: report (banner, summary.md, verdict.json), advise and compare print
the same verdict for the same records; the exits around them (an unwritable reports folder, a
compare page that cannot be written, its name, a corrupt records line)."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
from pathlib import Path

import pytest

from ple_bench.cli import main as cli_main
from ple_bench.report.verdict import FUNCTIONAL_TEXT, headline, verdicts
from tests._fake_runs import gpu_meta, write_run
from tests.test_verdict import _rec, _resident, _spread

BIG = (32 << 30) // 160  # a 32 GiB table of 160-byte rows


def _planted(results: Path, run_id: str = "20261202-120000-paths-a1b2", *, mode: str = "gpu",
             more: list[dict] | None = None) -> Path:
    """Resident steps and two host paths at 64 / 256 / 512 tokens, with samples: the flag path as
    fast as HBM at 64 and 256 tokens, slower at 512; the CPU gather slower everywhere."""
    recs = list(more or [])
    for tokens, base, ratio in ((64, 0.17, 1.005), (256, 0.23, 1.002), (512, 0.25, 1.10)):
        # the baseline: the resident full graph on the host-sync timer, base x 0.95
        flag = base * 0.95 * ratio
        recs.append(_resident(tokens, base * 0.98, base, samples=True, vocab=BIG, mode=mode))
        recs.append(_rec("pinned_host_flag", tokens, flag, graph="full", vocab=BIG, mode=mode,
                         samples_ms=_spread(flag, seed=tokens)))
        recs.append(_rec("pinned_cpu_gather", tokens, flag * 1.2, vocab=BIG, mode=mode,
                         samples_ms=_spread(flag * 1.2, seed=tokens + 1)))
    meta = gpu_meta(run_id, suite="paths", mode=mode)
    return write_run(results, run_id, meta, recs)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_advise_and_compare_print_the_same_verdict(tmp_path, capsys):
    run = _planted(tmp_path / "results")
    copy = tmp_path / "results" / "copy-of-the-run"
    shutil.copytree(run, copy)
    code, out, err = _cli(capsys, "report", str(run), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0, err
    doc = json.loads((run / "verdict.json").read_text())
    assert [(e["num_tokens"], e["verdict"]) for e in doc["verdicts"]] == [
        (64, "as fast"), (256, "as fast"), (512, "slower")]
    assert all(e["pinned_case_id"].startswith("step.pinned_host_flag") for e in doc["verdicts"])
    head = headline(verdicts(json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()))
    summary = (run / "summary.md").read_text()
    page = html_lib.unescape((tmp_path / "reports" / run.name / "index.html").read_text())
    assert head in summary and head in page
    assert "512 tokens slower (1.10" in head and "64 tokens as fast (1.00" in head

    code, out, err = _cli(capsys, "advise", "--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads",
                          "16", "--tokens", "64,256,512", "--compute-us", "200", "--runs", str(run), "--json")
    assert code == 0, err
    assert json.loads(out)["verdicts"] == doc["verdicts"]
    code, text, err = _cli(capsys, "advise", "--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads",
                           "16", "--tokens", "64,256,512", "--compute-us", "200", "--runs", str(run))
    assert code == 0, err
    flat = " ".join(text.split())  # the sentences are wrapped at 120 columns
    for e in doc["verdicts"]:
        assert (f"{e['num_tokens']} tokens {e['verdict']} ({e['ratio']:.3f}, 95 % CI {e['ci_low']:.3f}-"
                f"{e['ci_high']:.3f})") in flat
    assert max(map(len, text.splitlines())) <= 120
    assert "From 512 tokens HBM wins" in flat  # the flip, with what crosses what
    assert "rises from 1.002 at 256 tokens past 1.05 (HBM + 5 %) to 1.100 at 512" in flat

    code, out, err = _cli(capsys, "compare", str(run), str(copy), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0, err
    assert f"offload verdict, baseline {run.name}: {head}" in out
    assert f"offload verdict, candidate {copy.name}: {head}" in out


def test_the_short_advise_ranks_one_timer_at_a_time_and_all_prints_every_row(tmp_path, capsys):
    more = [_rec("pinned_cpu_gather", 256, 0.33, vocab=BIG, graph="eager", samples_ms=_spread(0.33, seed=3)),
            _rec("pinned_uva", 256, 0.30, vocab=BIG, ids_on="device", timer="cuda_event", kernel="triton_reference",
                 samples_ms=_spread(0.30, seed=4))]
    run = _planted(tmp_path / "results", more=more)
    argv = ["advise", "--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "256",
            "--compute-us", "200", "--runs", str(run)]
    code, short, _ = _cli(capsys, *argv)
    code_all, every, _ = _cli(capsys, *argv, "--all")
    assert code == code_all == 0
    rankings = short.split("ranked on the ")[1:]
    assert [r.split()[0] for r in rankings] == ["host_sync", "cuda_event"]  # the verdict's timer first
    for ranking, timer in zip(rankings, ("host_sync", "cuda_event")):
        rows = [line.split() for line in ranking.splitlines() if line.startswith(("    pinned host", "    HBM"))]
        paths = [r[2] if r[0] == "pinned" else r[1] for r in rows]
        assert rows[0][0] == "HBM" and len(paths) == len(set(paths))  # HBM, then one row per path
    assert "cuda_event" not in rankings[0] and "pinned_uva" in rankings[1]
    gathers = [line for line in every.splitlines() if "pinned_cpu_gather" in line and "pinned host" in line]
    assert len(gathers) == 2  # --all: both CPU-gather steps (eager and breakable)
    assert sum("pinned_cpu_gather" in line for line in short.splitlines() if "pinned host" in line) == 1


def test_a_functional_run_says_so_on_every_screen(tmp_path, capsys):
    run = _planted(tmp_path / "results", "20261202-120000-smoke-c0de", mode="functional")
    code, _, err = _cli(capsys, "report", str(run), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0, err
    assert json.loads((run / "verdict.json").read_text()) == {"functional": True, "verdict": FUNCTIONAL_TEXT,
                                                                "verdicts": []}
    page = (tmp_path / "reports" / run.name / "index.html").read_text()
    banner = page[page.index('<section id="verdict"'):page.index("</section>", page.index('<section id="verdict"'))]
    assert FUNCTIONAL_TEXT in banner and not re.search(r"\b(faster|as fast|slower)\b", banner)
    assert FUNCTIONAL_TEXT in (run / "summary.md").read_text()
    copy = tmp_path / "results" / "copy"
    shutil.copytree(run, copy)
    code, out, _ = _cli(capsys, "compare", str(run), str(copy), "--reports-dir", str(tmp_path / "reports"))
    assert f"offload verdict, baseline {run.name}: {FUNCTIONAL_TEXT}" in out


def test_report_into_an_unwritable_reports_dir_exits_2_naming_it(tmp_path, capsys):
    run = _planted(tmp_path / "results")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = _cli(capsys, "report", str(run), "--reports-dir", str(blocker / "reports"))
    assert code == 2
    assert str(blocker / "reports") in err and "Traceback" not in err


def test_compare_exits_2_before_any_verdict_when_its_page_cannot_be_written(tmp_path, capsys):
    """As report does: a nightly gate must not read "no regression" from a page that was never written."""
    run = _planted(tmp_path / "results")
    copy = tmp_path / "results" / "copy"
    shutil.copytree(run, copy)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out_path = blocker / "page.html"
    code, out, err = _cli(capsys, "compare", str(run), str(copy), "--out", str(out_path))
    assert code == 2 and "PASS" not in out
    assert f"--out {blocker}: not a writable folder" in err


def test_the_compare_page_is_named_after_the_run_folders(tmp_path, capsys):
    run = _planted(tmp_path / "results")
    copy = tmp_path / "results" / "a-copy"
    shutil.copytree(run, copy)  # the same meta.json run id in another folder
    code, out, _ = _cli(capsys, "compare", str(run), str(copy), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0
    assert (tmp_path / "reports" / f"compare-{run.name}-vs-a-copy.html").exists()
    assert not (tmp_path / "reports" / f"compare-{run.name}-vs-{run.name}.html").exists()


def test_a_corrupt_records_line_is_named_once_with_its_position(tmp_path, capsys):
    run = _planted(tmp_path / "results")
    lines = (run / "records.jsonl").read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # a torn line
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = _cli(capsys, "report", str(run), "--reports-dir", str(tmp_path / "reports"))
    assert code == 2  # bad input: the page is written, naming the line; the exit says it is not whole
    named = [line for line in err.splitlines() if "records.jsonl:3:" in line]
    assert len(named) == 1 and "not valid JSON" in named[0], err
    copy = tmp_path / "results" / "copy"
    shutil.copytree(run, copy)
    code, out, err = _cli(capsys, "compare", str(run), str(copy), "--reports-dir", str(tmp_path / "reports"))
    assert len([line for line in (out + err).splitlines() if f"{run.name}/records.jsonl:3:" in line]) == 1


def test_the_verdicts_plot_draws_the_verdicts_rows_hbm_in_its_own_colour_and_at_most_8_entries(tmp_path):
    from ple_bench.report.data import load_run
    from ple_bench.report.plots import HBM_COLOR, MAX_LEGEND, _path_colors, plot_verdict_rows, verdict_rows

    more = [_rec(impl, tokens, 0.30 + 0.01 * i, vocab=BIG, kernel=kernel, samples_ms=_spread(0.30 + 0.01 * i, seed=i))
            for i, (impl, kernel) in enumerate([("pinned_uva", "triton_reference"), ("pinned_uva", "triton_tuned"),
                                                ("pinned_uva", "torch_uva"), ("pinned_uva", "dedup_triton"),
                                                ("pinned_copy_engine", ""), ("pinned_host_graph", ""),
                                                ("pinned_hot_cache", "triton_tuned")])
            for tokens in (64, 256, 512)]
    run = load_run(_planted(tmp_path / "results", more=more))
    entries = {e.num_tokens: e for e in verdicts(run.records)}
    rows = verdict_rows(run)
    (panel,) = rows.panels.values()
    (hbm_name,) = rows.hbm_names
    assert [(t, ms) for t, ms, _ in panel[hbm_name]] == [(t, entries[t].resident_ms) for t in (64, 256, 512)]
    ringed = sorted((t, ms) for name, pts in panel.items() for t, ms, rests in pts if rests)
    assert ringed == [(t, entries[t].pinned_ms) for t in (64, 256, 512)]  # the steps the verdicts rest on
    assert len(panel) - 1 == 9  # every pinned path at this key, one line each
    plot = plot_verdict_rows(run)
    assert plot.legend_entries <= MAX_LEGEND < plot.series_total
    assert HBM_COLOR not in _path_colors(run).values()


def test_advise_on_functional_runs_says_there_is_no_performance_verdict(tmp_path, capsys):
    run = _planted(tmp_path / "results", "20261202-120000-smoke-c0de", mode="functional")
    code, out, err = _cli(capsys, "advise", "--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads",
                          "16", "--tokens", "256", "--compute-us", "200", "--runs", str(run))
    assert code == 2 and FUNCTIONAL_TEXT in err and "faster" not in out + err
