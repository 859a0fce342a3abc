"""importhook.py: a deferred module runs once, at its first use by any thread."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _run(tmp_path: Path, code: str) -> dict:
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


DEFERRED = """\
import counter, inspect, json, sys, threading
from tfonspark.importhook import Deferred
with Deferred(["slow", "broken"]).active():
    import slow, broken
out = {"file": slow.__file__.endswith("slow.py")}
inspect.getmodule(json.dumps)  # reads __file__ of every module, as TF's autograph does
import slow as again
out["same"] = again is slow
out["runs_before_use"] = counter.RUNS
seen = []
threads = [threading.Thread(target=lambda: seen.append(slow.VALUE)) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
out["seen"] = seen
out["runs"] = counter.RUNS
out["kind"] = type(slow).__name__
try:
    broken.anything
except ZeroDivisionError:
    out["broken"] = ["raised", "broken" in sys.modules]
try:
    import broken
except ZeroDivisionError:
    out["broken"].append("raised again")
print(json.dumps(out))
"""


def test_a_deferred_module_runs_once_at_its_first_use_by_any_thread(tmp_path) -> None:
    _tree(
        tmp_path,
        {
            "counter.py": "RUNS = 0\n",
            "slow.py": "import time, counter\ncounter.RUNS += 1\ntime.sleep(0.2)\nVALUE = 42\n",
            "broken.py": "1 / 0\n",
        },
    )
    found = _run(tmp_path, DEFERRED)
    assert found["file"] and found["same"], "its metadata is there before it runs"
    assert found["runs_before_use"] == 0, "import, __file__ and inspect.getmodule do not run it"
    assert found["seen"] == [42] * 8 and found["runs"] == 1, "threads wait for the one run"
    assert found["kind"] == "module"
    assert found["broken"] == ["raised", False, "raised again"], "a failed run is a failed import"
