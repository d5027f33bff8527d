"""Every relative link in the user-facing markdown (README.md, CHANGELOG.md, docs/*.md and the
READMEs and errata beside the archived logs and runs) points at a file or folder that exists.
Links to the web (http, https, mailto) and to an anchor in the same page are not followed; a
link's own ``#anchor`` is dropped before the path is checked; links inside code spans and code
blocks are not links."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"``.*?``|`[^`]*`")


def markdown_files(root: Path = REPO) -> list[Path]:
    files = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]
    files += sorted((root / "docs" / "gpu-logs").glob("*/README.md"))
    files += sorted((root / "docs" / "runs").glob("*.md"))  # the archive's index, not each run's generated summary
    return [f for f in files if f.is_file()]


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link outside code."""
    found, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found += [(n, m.group(1)) for m in LINK.finditer(CODE_SPAN.sub("", line))]
    return found


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    bad = []
    for n, target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        rel = target.split("#", 1)[0].split("?", 1)[0]
        if rel and not (path.parent / rel).exists():
            bad.append(f"{path.relative_to(root)}:{n}: {target}")
    return bad


def test_every_relative_link_resolves():
    files = markdown_files()
    assert REPO / "README.md" in files and len(files) > 5
    bad = [b for f in files for b in broken_links(f)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_check_finds_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[ok](there.md#a) [web](https://example.com) [self](#top) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n[gone](missing/file.log) ![img](there.md)\n")
    bad = broken_links(page, tmp_path)
    assert len(bad) == 1 and bad[0] == "docs/page.md:5: missing/file.log", bad
    assert markdown_files(tmp_path) == [page, tmp_path / "docs" / "there.md"]
