"""The reports in a real browser: headless Chromium opens them from file://,
the inline JS runs without errors, every inline image decodes, and the
table sorting/filtering self-check passes.  Skipped only when Chromium is not
installed (Debian package ``chromium``; CI installs it).

Set PLE_BENCH_SCREENSHOT_DIR to keep the screenshots for a person to look at.
"""

from __future__ import annotations

import html as html_lib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ._fake_runs import write_cpu_run, write_gpu_run
from ple_bench.report import build_report
from ple_bench.report.compare import compare_runs, write_compare_html
from tests._fixtures import FIXTURE_RUNS


def _find_chromium() -> str | None:
    for candidate in (os.environ.get("PLE_BENCH_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


CHROMIUM = _find_chromium()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package `chromium`; "
                                                "CI installs it: apt-get install -y chromium)"),
]


def chromium(tmp_path: Path, *args: str, window: str = "1400,3000") -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
           "--no-first-run", "--hide-scrollbars", "--mute-audio", f"--user-data-dir={profile}",
           f"--window-size={window}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def body_attributes(dom: str) -> dict[str, str]:
    tag = re.search(r"<body\b([^>]*)>", dom)
    assert tag, dom[:500]
    return {k: html_lib.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag.group(1))}


def console_messages(stderr: str) -> list[str]:
    """Messages the page wrote to the console (Chromium logs them as CONSOLE lines)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def load_page(tmp_path: Path, page: Path) -> tuple[dict[str, str], list[str]]:
    proc = chromium(tmp_path, "--dump-dom", page.resolve().as_uri() + "#selftest")
    return body_attributes(proc.stdout), console_messages(proc.stderr)


def assert_page_works(tmp_path: Path, page: Path, min_images: int) -> dict[str, str]:
    attrs, console = load_page(tmp_path, page)
    n_img = len(re.findall(r"<img\b", page.read_text()))
    assert n_img >= min_images
    assert attrs.get("data-ready") == "1", attrs
    assert attrs.get("data-js-errors") == "0", attrs.get("data-js-error-text")
    assert console == [], console
    assert attrs.get("data-images-total") == str(n_img)
    assert attrs.get("data-images-loaded") == str(n_img)
    assert attrs.get("data-selftest") == "pass", attrs.get("data-selftest")
    return attrs


@pytest.fixture(scope="module")
def gpu_page(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-gpu")
    return build_report(write_gpu_run(root / "results"), root / "reports")


def test_gpu_report_in_chromium(tmp_path, gpu_page):
    assert_page_works(tmp_path, gpu_page, min_images=5)


def test_the_verdict_is_in_the_first_viewport(tmp_path, gpu_page):
    """The answer first: the verdict block lies inside a 1280 x 800 window, above everything else."""
    proc = chromium(tmp_path, "--dump-dom", gpu_page.resolve().as_uri(), window="1280,800")
    attrs = body_attributes(proc.stdout)
    top, bottom = int(attrs["data-verdict-top"]), int(attrs["data-verdict-bottom"])
    assert 0 < top < bottom <= 800, (top, bottom)
    assert 'id="verdict"' in proc.stdout and proc.stdout.index('id="verdict"') < proc.stdout.index('id="findings"')


def test_gpu_report_screenshot(tmp_path, gpu_page):
    from matplotlib.image import imread

    keep = os.environ.get("PLE_BENCH_SCREENSHOT_DIR")
    shot = Path(keep) / "report-gpu.png" if keep else tmp_path / "report-gpu.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    chromium(tmp_path, f"--screenshot={shot}", gpu_page.resolve().as_uri(), window="1400,4000")
    pixels = imread(shot)
    assert pixels.shape[:2] == (4000, 1400)
    # Not a blank page: the header is dark, the body light, and the plots add many colours.
    assert pixels[:60, :, :3].mean() < 0.3 and pixels[200:, :, :3].mean() > 0.7
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 200


def test_cpu_report_and_compare_page_in_chromium(tmp_path):
    cpu_page = build_report(write_cpu_run(tmp_path / "results"), tmp_path / "reports")
    assert_page_works(tmp_path, cpu_page, min_images=1)
    base = write_gpu_run(tmp_path / "results", "base", seed=1, include_broken=False)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, factor=lambda c: 1.2 if c.impl == "device" else 1.0)
    compare_page = write_compare_html(compare_runs(base, cand), tmp_path / "reports" / "compare.html")
    assert_page_works(tmp_path, compare_page, min_images=0)


def test_checks_catch_a_broken_page(tmp_path, gpu_page):
    """The same checks fail on a page with a script error and a missing image."""
    broken = tmp_path / "broken.html"
    broken.write_text(gpu_page.read_text().replace(
        "</body>", '<script>notDefinedAnywhere();</script><img src="missing.png" alt="x"></body>'))
    attrs, console = load_page(tmp_path, broken)
    assert attrs.get("data-ready") == "1"
    assert int(attrs["data-js-errors"]) >= 2  # the exception and the failed image
    assert "notDefinedAnywhere" in attrs["data-js-error-text"]
    assert any("notDefinedAnywhere" in line for line in console)
    assert int(attrs["data-images-loaded"]) == int(attrs["data-images-total"]) - 1


# ------------------------------------------------ the first screen and the layout at 1280 x 800

ARCHIVED = FIXTURE_RUNS


@pytest.fixture(scope="module")
def pages_1280(tmp_path_factory, gpu_page):
    """The fake GPU run's page and the two archived H200 runs' (default, paths), each opened at
    1280 x 800 with the self-test (which opens every plot in the lightbox and closes it)."""
    root = tmp_path_factory.mktemp("browser-1280")
    pages = {"fake": gpu_page}
    for name, run in (("default", "20261201-123806-default-fa39"), ("paths", "20261201-130202-paths-b4db")):
        pages[name] = build_report(ARCHIVED / run, root / "reports")
    out = {}
    for name, page in pages.items():
        proc = chromium(root, "--dump-dom", page.resolve().as_uri() + "#selftest", window="1280,800")
        out[name] = (body_attributes(proc.stdout), proc.stdout)
    return out


@pytest.mark.parametrize("name", ["fake", "default", "paths"])
def test_nothing_is_wider_than_the_window(pages_1280, name):
    attrs, _ = pages_1280[name]
    assert attrs["data-viewport-width"] == "1280"
    assert int(attrs["data-scroll-width"]) <= 1280, attrs.get("data-wide")
    assert attrs["data-wide"] == ""  # wide tables scroll inside their own box


@pytest.mark.parametrize("name", ["fake", "default", "paths"])
def test_the_first_screen_holds_the_verdict_and_one_readable_plot(pages_1280, name):
    attrs, _ = pages_1280[name]
    assert 0 < int(attrs["data-verdict-top"]) < int(attrs["data-verdict-bottom"]) <= 800
    top, bottom = int(attrs["data-first-plot-top"]), int(attrs["data-first-plot-bottom"])
    assert int(attrs["data-verdict-bottom"]) < top < bottom <= 800, (top, bottom)
    assert int(attrs["data-first-plot-width"]) >= 1100  # the page's width, not a thumbnail


@pytest.mark.parametrize("name", ["fake", "default", "paths"])
def test_every_plot_enlarges_on_a_click_and_legends_stay_short(pages_1280, name):
    attrs, dom = pages_1280[name]
    figures = re.findall(r'<figure id="plot-[^"]*" class="plot[^"]*"([^>]*)>', dom)
    assert figures and attrs["data-zoomtest"] == "pass", attrs.get("data-zoomtest")
    assert attrs["data-plots-zoomable"] == attrs["data-plots-enlarged"] == str(len(figures))
    legends = [int(m) for f in figures for m in re.findall(r'data-legend-entries="(\d+)"', f)]
    assert len(legends) == len(figures) and max(legends) <= 8, legends


def test_the_ceilings_show_no_long_float_reprs(pages_1280):
    """In the browser's DOM of the archived default run: every number of the ceiling tables at
    most 4 significant digits (meta.json stores them as 0.0486355, 1.5261366649999957)."""
    _, dom = pages_1280["default"]
    run = dom[dom.index('id="ceilings"'):dom.index("</section>", dom.index('id="ceilings"'))]
    cells = re.findall(r'<td class="num"[^>]*>([^<]*)</td>', run)
    fractions = [c for c in cells if "." in c]
    assert len(cells) > 450 and fractions
    long = [c for c in fractions if len(re.sub(r"\D", "", c.split("e")[0]).lstrip("0")) > 4]
    assert not long, long[:5]


def test_a_cpu_functional_runs_first_screen_makes_no_performance_claim(tmp_path):
    """A CPU smoke run's report, read as a person reads it: the text inside the first 1280 x 800
    window says that a functional run gives no performance verdict, and nothing there says faster,
    as fast or slower -- although its records hold pinned steps beside resident ones (timed on the
    CPU's clock) that a GPU run's banner would rank."""
    from ple_bench.report.verdict import FUNCTIONAL_TEXT
    from .test_one_answer import _planted

    run = _planted(tmp_path / "results", "20261202-120000-smoke-c0de", mode="functional")
    page = build_report(run, tmp_path / "reports")
    proc = chromium(tmp_path, "--dump-dom", page.resolve().as_uri(), window="1280,800")
    seen = body_attributes(proc.stdout)["data-first-screen-text"]
    assert FUNCTIONAL_TEXT in seen, seen[:2000]
    claims = re.findall(r"\b(faster|as fast|slower|wins|beats)\b", seen, flags=re.IGNORECASE)
    assert not claims, (claims, seen[:2000])
