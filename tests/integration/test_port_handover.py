"""Issue 21, row 1: the node's TF port stays held until TF's server binds it.

Each case runs one real TF process (``port_handover_worker.py``, about 10 s): the port is
reserved as the supervisor does, ``entry.run`` starts ``map_fun`` as a node does, and two other
processes (user nobody where the tests run as root) spin on ``bind()`` of the port from the
reservation on. Before the hand-over, ``entry.run`` freed the port before ``map_fun`` was even
unpickled and the intruder had it within microseconds: TF's server then failed ("Could not
start gRPC server") or listened on IPv4 only while the intruder kept ``[::1]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tfonspark

WORKER = Path(__file__).with_name("port_handover_worker.py")
SRC = Path(tfonspark.__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hand-over relies on Linux bind() rules")
@pytest.mark.parametrize("mode", ["start_cluster_server", "mwms", "explicit"])
def test_no_other_process_can_take_the_port_before_the_tf_server_binds_it(mode, tmp_path):
    pytest.importorskip("tensorflow")
    out = tmp_path / "result.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode, str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    errors = [event["traceback"] for event in result["events"] if event["type"] == "process_error"]
    assert result["code"] == 0 and not errors, errors
    plain, reuseaddr = result["intruders"]["plain"], result["intruders"]["reuseaddr"]
    # the plain intruder (the issue's) spun from the reservation until the server was up, through
    # the hand-over; the SO_REUSEADDR one until just before the server start (see server.py)
    assert plain["took"] == "" and plain["attempts"] > 1000, plain
    assert reuseaddr["took"] == "" and reuseaddr["attempts"] > 1000, reuseaddr
    assert result["server"] and result["listening"]  # TF's own server has the port and answers on it
    assert result["still_held"] == []  # and the reservation is gone once it has
