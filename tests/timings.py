"""Where the suite's time goes: every test's duration to ``build/durations.txt``, the ten slowest
printed at the end (``make test`` loads this plugin with ``-p tests.timings``).

A report, not a check: timings on shared 2-core machines are noisy, so nothing here fails a run.
Under pytest-xdist the workers' reports reach the controller, which alone writes the file. A
test's duration is its setup, call and teardown together (a fixture that starts Spark counts
for the first test that asks for it).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT = Path(__file__).resolve().parents[1] / "build" / "durations.txt"
SLOWEST = 10

_durations: dict[str, float] = defaultdict(float)
_started = time.monotonic()


def _is_controller(config: pytest.Config) -> bool:
    """True in the process that sees every test: the xdist controller, or pytest without xdist."""
    return not hasattr(config, "workerinput") and "PYTEST_XDIST_WORKER" not in os.environ


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration to its test (the controller gets the workers' reports too)."""
    _durations[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write every test's duration, slowest first, as ``seconds  node id`` lines."""
    if not _is_controller(session.config) or not _durations:
        return
    OUT.parent.mkdir(exist_ok=True)
    ranked = sorted(_durations.items(), key=lambda item: -item[1])
    OUT.write_text("".join(f"{secs:9.2f}  {nodeid}\n" for nodeid, secs in ranked))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Print the run's wall time and its ten slowest tests."""
    if not _is_controller(config) or not _durations:
        return
    wall = time.monotonic() - _started
    write = terminalreporter.write_line
    terminalreporter.section("timings")
    write(f"pytest wall time: {wall / 60:.1f} min ({wall:.0f} s); every test's duration: {OUT}")
    write(f"the {SLOWEST} slowest tests (setup + call + teardown):")
    for nodeid, secs in sorted(_durations.items(), key=lambda item: -item[1])[:SLOWEST]:
        write(f"{secs:9.2f}s  {nodeid}")
