"""Every relative link in the README, docs/ and benchmarks/README.md leads somewhere that exists.

The README is short and points into docs/ and benchmarks/; a renamed page or heading must not
leave a reader on a dead link. Anchors into Markdown files are checked against GitHub's heading
slugs.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page, repeated headings numbered as GitHub does."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found


def relative_links(page: Path) -> list[str]:
    """The links of a page that point into the repository (no scheme, no mail)."""
    targets = LINK.findall(prose(page.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def shown(path: Path) -> str:
    """A path as a reader of the repository would write it."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def broken(page: Path, target: str) -> str | None:
    """Why a link of ``page`` leads nowhere, or None when it resolves."""
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / unquote(path_part)).resolve() if path_part else page
    if not dest.exists():
        return f"{target}: no file {shown(dest)}"
    if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
        return f"{target}: no heading #{anchor} in {shown(dest)}"
    return None


def test_the_pages_checked_include_the_readme_and_docs():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "benchmarks/README.md", "docs/settings.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    problems = [why for t in relative_links(page) if (why := broken(page, t))]
    assert not problems, f"{shown(page)}: " + "; ".join(problems)


def test_the_link_checker_sees_links_and_anchors(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n## In `map_fun(args, ctx)`\n## TFoS's own\n## Top\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#in-map_funargs-ctx) [ok](a.md#tfoss-own) [ok](a.md#top-1) [web](https://x.y/z)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n[bad](a.md#nope) [gone](gone.md)\n"
    )
    assert relative_links(page) == ["a.md#in-map_funargs-ctx", "a.md#tfoss-own", "a.md#top-1", "a.md#nope", "gone.md"]
    assert [t for t in relative_links(page) if broken(page, t)] == ["a.md#nope", "gone.md"]
