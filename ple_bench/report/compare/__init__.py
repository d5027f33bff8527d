"""Regression compare of stored runs: baseline vs candidate, one run or several a side.

Cases are matched by ``case_id``; only cases measured (status ok) on both sides
are compared.  Every sample list is first put through the record's throttle
filter (:func:`ple_bench.report.data.measured_samples`: the samples flagged
``samples_throttled`` are dropped, exactly as the run's own ``median_ms`` dropped
them), and the median shown and the samples tested are the *same* list.  An
older record that counts throttled samples without flagging them is compared on
all its samples, median and test alike, and the output says so.

**The timer is checked per case.**  Each record names the timer that took its
samples (``timer``: ``cuda_event``, events around calls queued behind a
launch-hiding spin -- what every record had before the host-sync timer, host
paths included; ``host_sync``, synchronized calls on the host clock;
``host_monotonic``, functional mode; nothing in the oldest skipped records).
A case whose baseline and candidate records were timed differently (or a side
whose runs mixed timers) is **not comparable**: the two numbers measure
different things (a host path moved from ``cuda_event`` to ``host_sync`` reads
-91 %), so it is listed with both timers named, never a regression or an
improvement, and it does not change the exit code.

Two modes, chosen by how many runs each side has:

* **Run medians** (at least :data:`MIN_RUNS` = 3 runs on *each* side,
  ``compare B1 B2 B3 --vs C1 C2 C3``).  A case's observations are its per-run
  medians.  The change is that of the median of run medians; a case is a
  **regression** only when it is slower by more than ``threshold_pct`` *and* a
  **one-sided** exact Mann-Whitney U test on the run medians (baseline
  stochastically faster than candidate) gives a **Holm-adjusted** ``p <= alpha``;
  an **improvement** is the mirror image (the test in the other direction).
  Why one-sided: the gate asks a directional question fixed before looking at
  the data ("did the candidate get slower?"); a two-sided exact test cannot get
  below 2/C(2n, n).  Why adjusted: one compare tests every case of the suite
  (23 in ``nightly``), and the gate fails when *any* of them is called, so the
  error to bound is the chance that a night with no change fails on some case
  (the family-wise error), not each case's own.  With per-case ``alpha`` = 0.05
  and 23 cases that chance is far above 5 % (``tests/test_compare.py::
  test_unchanged_nights_rarely_fail``; docs/nightly.md has the measured rates).
  **Holm** (not Benjamini-Hochberg) because a failed night is a family-wise
  event: Holm bounds the probability of *any* false regression by ``alpha``
  under every combination of changed and unchanged cases, with no assumption on
  how the cases' p-values depend on each other (cases of one run share the
  machine, so they are not independent); Benjamini-Hochberg bounds the expected
  *share* of false calls among the calls, which equals the family-wise error
  only when nothing changed and is looser whenever something did -- the right
  tool for screening many results, not for a pass/fail gate.  The family is the
  cases tested in this compare (run-median cases with a test; not the
  insufficient, workload or not-comparable ones); raw and adjusted p are shown.
  The exact test is discrete: its smallest p is 1/C(nb + nc, nb) (0.05 at 3 vs 3,
  0.014 at 4 vs 4, 0.004 at 5 vs 5, 0.0011 at 6 vs 6), and after Holm over m
  cases the smallest p must be <= alpha / m -- with 3 vs 3 runs nothing can ever
  be called, and for the 23 nightly cases at alpha 0.05 it takes 6 runs a side
  (:func:`runs_needed`); the output says so when the runs given cannot reach it.
  A case with fewer than 3 ok runs on a side is **insufficient**.  Run medians
  are the honest unit: samples of one run share one process, one table
  allocation and one machine state (a pinned table's placement alone moves a run
  by up to ~12 %, docs/nightly.md), so they are not independent; separate runs
  are.  ``p_adjust="none"`` (``--p-adjust none``) gives the per-case rule.
* **Pooled samples** (1 or 2 runs on a side; ``compare BASE CAND`` is this
  mode) -- **advisory**.  The runs' samples are pooled per side; the change is
  that of the pooled medians, and the test is a two-sided Mann-Whitney U on the
  pooled raw samples with ``p <= alpha`` (default 0.01, no adjustment) -- the asv
  rule.  Samples within one run are not independent, so this p-value is
  optimistic (:data:`INDEPENDENCE_CAVEAT`): the verdicts are printed with that
  note and a regression does not fail the compare (exit 0) unless
  ``strict_pooled`` (``--strict-pooled``) asks for the old gate.  Fewer than
  :data:`MIN_SAMPLES` samples on either side is **insufficient**.

In both modes a change over the threshold that is not significant is **noisy**;
a case ok on the baseline side (in any of its runs) that failed or was invalid
in any candidate run is **broken**.  A decode step whose compute was calibrated
to a different number of matmuls on the two sides (``compute_matmuls``: the
calibration picks the count per run, and on the H200 the same code gave 10 and
11 matmuls for 200 us in two runs) did not do the same work: its verdict is
**workload**, whatever its times, and it fails nothing.  When a run is in
functional mode (:attr:`ple_bench.report.data.Run.functional`, the check the
HTML report's "No verdict" uses) the times are the CPU's: every timed case is
**no verdict** and the compare says "No verdict: functional-mode runs time the
CPU, not the GPU".

Summaries as tables: :func:`summary_frame` (one row per case: case id, the axes
that differ across the cases, both times, both noises, change, raw and adjusted
p, and an nvbench_compare-like status from :data:`STATUS`), written as markdown
(``--markdown PATH``) and CSV (``--csv PATH``).  The history page of a results
directory (each case's run median over the ordered runs) is
:mod:`ple_bench.report.history` (``compare --history RESULTS_DIR``).

Exit codes of the CLI (``python -m ple_bench compare BASE CAND`` or
``compare BASE... --vs CAND...``): 0 no regression (pooled mode: whatever the
verdicts, unless ``--strict-pooled``; functional runs: no verdict); 1 a
regression on run medians (or pooled with ``--strict-pooled``), or a broken case
(in every mode: a case that stopped working is not a timing verdict); 2 bad input
(missing run, no meta.json, no case measured on both sides -- different suites
with nothing in common is not a pass -- or a bad command line).

The package, one noun a module: :mod:`.stats` (the test, Holm, the thresholds, one case's rule),
:mod:`.result` (the verdicts, :class:`CaseComparison`, :class:`CompareResult`), :mod:`.matching`
(pairing the cases of two sides, :func:`compare_runs`) and :mod:`.writers` (text table, HTML,
markdown, CSV).  The command line (its flags, the verb, the exit code) is
:mod:`ple_bench.commands.compare`.
"""

from __future__ import annotations

from .matching import compare_case, compare_loaded, compare_pooled, compare_run_medians, compare_runs, timer_of
from .result import NO_VERDICT, NOT_COMPARABLE, STATUS, VERDICTS, CaseComparison, CompareResult
from .stats import (MIN_RUNS, MIN_SAMPLES, P_ADJUST, RUNS_ALPHA, SAMPLES_ALPHA, holm, mann_whitney_p, runs_needed,
                    significant, smallest_one_sided_p)
from .writers import (default_html_name, format_table, markdown_summary, rule_text, summary_frame, write_compare_html,
                      write_csv, write_markdown)

__all__ = ["CaseComparison", "CompareResult", "MIN_RUNS", "MIN_SAMPLES", "NOT_COMPARABLE", "NO_VERDICT", "P_ADJUST",
           "RUNS_ALPHA", "SAMPLES_ALPHA", "STATUS", "VERDICTS", "compare_case", "compare_loaded", "compare_pooled",
           "compare_run_medians", "compare_runs", "default_html_name", "format_table", "holm", "mann_whitney_p",
           "markdown_summary", "rule_text", "runs_needed", "significant", "smallest_one_sided_p", "summary_frame",
           "timer_of", "write_compare_html", "write_csv", "write_markdown"]
