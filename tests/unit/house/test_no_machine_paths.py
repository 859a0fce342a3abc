"""What users read names no path outside the repository and no path of any machine.

The README, docs/, examples/, src/ and benchmarks/README.md are what a user reads or runs from
a clone: a data directory beside the project's own checkout, or this machine's absolute paths,
mean nothing there (issue 47). Tests and benchmarks may read the project's data beside the
checkout, through ``tests/conftest.py`` and ``benchmarks/_data.py``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
READ = ("README.md", "docs", "examples", "src", "benchmarks/README.md")
SUFFIXES = {".md", ".py", ".pyi", ".txt", ".toml", ".cfg", ".sh", ".pyx", ".c", ""}


def _read_files() -> list[Path]:
    """The tracked text files of what users read (git's list: no build output, no caches)."""
    out = subprocess.run(["git", "ls-files", "--", *READ], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / name for name in out.stdout.splitlines() if Path(name).suffix in SUFFIXES]


def _forbidden() -> re.Pattern[str]:
    """``../shared``, this checkout's own absolute path and its parent's, a root's home, pytest's tmp."""
    here = [re.escape(str(REPO)), re.escape(str(REPO.parent) + "/")]
    return re.compile("|".join([r"\.\./shared\b", *here, r"/root/", r"/tmp/pytest-of-"]))


def test_the_scan_reads_the_pages_and_finds_a_planted_path():
    files = _read_files()
    assert REPO / "README.md" in files and REPO / "examples" / "mnist" / "mnist_ps.py" in files, files[:5]
    assert _forbidden().search("python x.py --data ../shared/data/mnist")
    assert _forbidden().search(f"default {REPO.parent}/shared/data/mnist")
    assert not _forbidden().search("--data /path/to/mnist, working_dir='/home/me/job'")


def test_no_page_example_or_module_names_a_path_outside_the_repository():
    forbidden = _forbidden()
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _read_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if forbidden.search(line)
    ]
    assert not found, "paths users do not have:\n" + "\n".join(found)
