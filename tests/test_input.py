"""Bad input at the command line: each ends in exit 2 naming the file (and line) or flag, or in a
warning naming the line it loses -- never a traceback, never a silent drop; and where a report
of a run folder goes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ple_bench import results
from ple_bench.cli import main
from tests._fake_runs import write_gpu_run

ADVISE = ["advise", "--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16",
          "--tokens", "256", "--compute-us", "100"]


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    return write_gpu_run(tmp_path / "results")


def _lines(run_dir: Path) -> list[str]:
    return (run_dir / "records.jsonl").read_text().splitlines()


def _case(line: str) -> str:
    return json.loads(line)["case_id"]


def test_a_corrupt_line_is_named_by_every_reader(run_dir, capsys):
    lines = _lines(run_dir)
    lost = _case(lines[3])
    lines[3] = lines[3][:40] + "\x00garbage" + lines[3][60:]  # a corrupt byte mid-file, case_id still legible
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    where = f"{run_dir / 'records.jsonl'}:4"

    recs = results.load_records(run_dir)
    err = capsys.readouterr().err
    assert len(recs) == len(lines) - 1
    assert where in err and lost in err and "left out" in err
    found: list[results.LostLine] = []
    results.load_records(run_dir, lost=found)
    assert [(x.line, x.case_id) for x in found] == [(4, lost)]


def test_report_of_a_corrupt_line_says_so_on_the_page_and_exits_2(run_dir, tmp_path, capsys):
    lines = _lines(run_dir)
    lost = _case(lines[3])
    lines[3] = lines[3][:40] + "\x00garbage" + lines[3][60:]
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run_dir), "--reports-dir", str(tmp_path / "rep")]) == 2
    out, err = capsys.readouterr()
    page = Path(out.strip().splitlines()[-1]).read_text()  # the page is still written
    assert 'id="unreadable-lines"' in page and "line 4 (case" in page and lost in page
    assert "could not be read (line 4)" in page  # in the status finding too, not only "not reached"
    assert f"of {run_dir / 'records.jsonl'} could not be read (line 4)" in err


def test_report_of_an_empty_records_file_warns(run_dir, tmp_path, capsys):
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["expected_cases"] = {"sweep": [_case(line) for line in _lines(run_dir)]}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "records.jsonl").write_text("")
    assert main(["report", str(run_dir), "--reports-dir", str(tmp_path / "rep")]) == 0
    out, err = capsys.readouterr()
    page = Path(out.strip().splitlines()[-1]).read_text()
    assert 'id="no-records"' in page and "The run holds no records" in page
    assert "holds no records" in err


def test_compare_prints_its_answer_first_and_once(tmp_path, capsys):
    base, cand = write_gpu_run(tmp_path / "a", seed=1), write_gpu_run(tmp_path / "b", seed=2)
    assert main(["compare", str(base), str(cand), "--reports-dir", str(tmp_path / "rep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PASS") and "cases compared" in lines[0]
    assert sum("cases compared" in line for line in lines) == 1


def test_compare_does_not_call_an_unreadable_case_only_in_baseline(tmp_path, capsys):
    base = write_gpu_run(tmp_path / "a")
    cand = write_gpu_run(tmp_path / "b")
    lines = _lines(cand)
    lost = _case(lines[2])
    lines[2] = lines[2][: len(lines[2]) // 2]
    (cand / "records.jsonl").write_text("\n".join(lines) + "\n")
    main(["compare", str(base), str(cand), "--reports-dir", str(tmp_path / "rep")])
    out, err = capsys.readouterr()
    where = f"{cand / 'records.jsonl'}:3"
    assert "only in baseline" not in out  # it is in the candidate, on a line that cannot be read
    assert where in out and lost in out and "not compared" in out
    assert (out + err).count(where) == 1  # one warning for the line, with its position (not once per reader)


def test_a_torn_line_recorded_again_later_is_not_reported(run_dir, capsys):
    """A resume after a torn write records the case again: nothing is lost."""
    lines = _lines(run_dir)
    torn = lines[1][: len(lines[1]) // 2]
    (run_dir / "records.jsonl").write_text("\n".join([lines[0], torn] + lines[1:]) + "\n")
    recs = results.load_records(run_dir)
    assert len(recs) == len(lines) and capsys.readouterr().err == ""


@pytest.mark.parametrize("verb", ["report", "compare", "advise"])
def test_a_record_without_case_id_exits_2_naming_file_and_line(run_dir, verb, tmp_path, capsys):
    lines = _lines(run_dir)
    rec = json.loads(lines[5])
    del rec["case_id"]
    lines[5] = json.dumps(rec)
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    argv = {"report": ["report", str(run_dir), "--reports-dir", str(tmp_path / "rep")],
            "compare": ["compare", str(run_dir), str(run_dir), "--reports-dir", str(tmp_path / "rep")],
            "advise": ADVISE + ["--runs", str(run_dir)]}[verb]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run_dir / 'records.jsonl'}:6" in err and "case_id" in err and "Traceback" not in err


@pytest.mark.parametrize("verb", ["report", "compare", "advise", "resume"])
def test_a_truncated_meta_json_exits_2_naming_it(run_dir, verb, tmp_path, capsys):
    meta = run_dir / "meta.json"
    meta.write_text(meta.read_text()[:200])
    argv = {"report": ["report", str(run_dir), "--reports-dir", str(tmp_path / "rep")],
            "compare": ["compare", str(run_dir), str(run_dir), "--reports-dir", str(tmp_path / "rep")],
            "advise": ADVISE + ["--runs", str(run_dir)],
            "resume": ["run", "--resume", str(run_dir)]}[verb]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(meta) in err and "not valid JSON" in err


@pytest.mark.parametrize("flag", ["--results-dir", "--reports-dir"])
def test_an_unwritable_output_folder_exits_2_before_any_case(tmp_path, flag, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    argv = ["run", "--suite", "smoke", "--results-dir", str(tmp_path / "res"), "--reports-dir",
            str(tmp_path / "rep"), flag, str(blocker / "sub")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {blocker / 'sub'}: not a writable folder" in err
    assert not list(results.iter_run_dirs(tmp_path / "res"))  # no run was started


@pytest.mark.parametrize("flag", ["--out", "--reports-dir", "--markdown"])
def test_compare_into_an_unwritable_place_exits_2_naming_the_flag(run_dir, tmp_path, flag, capsys):
    """As report does: a nightly gate must not read "no regression" from a page never written."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    target = blocker / "sub" / ("c.html" if flag != "--reports-dir" else "")
    argv = ["compare", str(run_dir), str(run_dir), "--reports-dir", str(tmp_path / "rep"), flag, str(target)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"{flag} {blocker / 'sub'}: not a writable folder" in err
    assert "HTML diff:" not in out


@pytest.mark.parametrize("argv", [["run", "--suite", "smoke", "--samples", "0"],
                                  ["profile", "--suite", "smoke", "--case", "lookup.device.v4096.d64.bf16.h4.t16-83da397d",
                                   "--samples", "0", "--dry-run"]])
def test_samples_below_one_exits_2_naming_the_flag(argv, tmp_path, capsys):
    assert main(argv + ["--results-dir", str(tmp_path / "res")]) == 2
    assert "--samples 0" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("seconds", ["0", "-1"])
def test_a_case_timeout_not_above_zero_exits_2_naming_the_flag(seconds, tmp_path, capsys):
    assert main(["run", "--suite", "smoke", "--case-timeout", seconds, "--results-dir", str(tmp_path / "res")]) == 2
    assert f"--case-timeout {seconds}" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()  # no case ran


def test_resume_with_another_suite_is_refused(tmp_path, capsys):
    suite = tmp_path / "mine.toml"
    suite.write_text('[suite]\ndescription = "x"\n[[group]]\nimpl = "device"\nvocab_size = 64\n')
    run = results.RunWriter(tmp_path / "res" / "r1")
    run.write_meta({"suite": "mine", "suite_path": str(suite), "mode": "functional", "status": "interrupted"})
    assert main(["run", "--resume", str(run.run_dir), "--suite", "smoke"]) == 2
    err = capsys.readouterr().err
    assert "--suite smoke names another" in err and "drop --suite" in err
    assert not run.records_path.exists()  # nothing ran


def test_report_of_a_copy_does_not_overwrite_the_original_report(run_dir, tmp_path, capsys):
    reports = tmp_path / "reports"
    assert main(["report", str(run_dir), "--reports-dir", str(reports)]) == 0
    first = reports / run_dir.name / "index.html"
    before = first.read_bytes()
    renamed = tmp_path / "edited"
    shutil.copytree(run_dir, renamed)
    assert main(["report", str(renamed), "--reports-dir", str(reports)]) == 0
    assert (reports / "edited" / "index.html").exists()  # named after the folder, not meta's run_id
    same_name = tmp_path / "copy" / run_dir.name
    shutil.copytree(run_dir, same_name)
    capsys.readouterr()
    assert main(["report", str(same_name), "--reports-dir", str(reports)]) == 2
    assert "another run folder of the same name" in capsys.readouterr().err
    assert first.read_bytes() == before
    assert main(["report", str(run_dir), "--reports-dir", str(reports)]) == 0  # its own report: rebuilt


def test_the_report_names_the_cases_a_run_did_not_reach(run_dir, tmp_path):
    from ple_bench.report import build_report
    from ple_bench.report.data import load_run
    from ple_bench.report.findings import status_finding

    ids = [_case(line) for line in _lines(run_dir)]
    missing = ["lookup.pinned_uva.v312500000.d160.fp8.h16.t256.exact-00000001",
               "lookup.pinned_uva.v671088640.d160.fp8.h16.t256.exact-00000002"]
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.update(status="interrupted", num_cases=len(ids) + 2,
                expected_cases={"sweep": ids, "large": missing})
    (run_dir / "meta.json").write_text(json.dumps(meta))
    run = load_run(run_dir)
    assert run.not_reached == {"large": missing} and run.n_expected == len(ids) + 2
    assert f"of {len(ids) + 2} cases measured" in status_finding(run)[0].text
    assert "2 not reached" in status_finding(run)[0].text
    page = build_report(run_dir, tmp_path / "rep").read_text()
    assert f"of {len(ids) + 2} cases measured" in page and "2 not reached" in page
    assert "large (2)" in page and all(m in page for m in missing)
    assert f"--resume {run_dir}" in page


def test_list_wide_without_a_suite_exits_2_naming_the_flags(capsys):
    assert main(["list", "--wide"]) == 2
    err = capsys.readouterr().err
    assert "--wide" in err and "--suite" in err


def test_the_suite_list_aligns_its_columns_and_states_each_count_once_and_right(capsys):
    import re

    from ple_bench.spec.suite import list_suites

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    counts = {s.name: len(s.cases) for s in list_suites()}
    assert len(lines) == len(counts)
    assert len({line.index(" cases  ") for line in lines}) == 1  # one column, whatever the name's length
    for line in lines:
        name = line.split()[0]
        stated = [int(n) for n in re.findall(r"(\d+) cases", line)]
        assert stated == [counts[name]], line  # nightly's description said "about 20 cases" beside its 26


def test_schema_help_points_to_a_file_that_exists(capsys):
    from ple_bench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    text = sub.choices["schema"].format_help() + " ".join(a.help or "" for a in sub._choices_actions)
    assert "README's record section" not in text
    assert "docs/schema.md" in text and (Path(__file__).resolve().parents[1] / "docs" / "schema.md").is_file()
