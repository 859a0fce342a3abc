"""Nothing a node makes outlives it, however it dies (real Spark, local-cluster[2,1,1024])."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

import tfonspark
from tfonspark import InputMode
from tfonspark.errors import NodeFailed

from .conftest import by_value, feed_socket_dirs, node_processes, supervisor_of, wait_until

by_value(__name__)


def _explode(message):
    raise RuntimeError(message)


class _FailsToUnpickle:
    """tf_args that pickle on the driver but raise when the TF process unpickles its payload."""

    def __reduce__(self):
        return _explode, ("tf_args cannot be rebuilt in the TF process",)


def _never_runs(args, ctx):
    raise AssertionError("map_fun must not run when its payload cannot be unpickled")


def test_tf_process_failing_before_map_fun_leaves_no_feed_socket(sc, no_leftovers):
    before = set(feed_socket_dirs())
    with pytest.raises(NodeFailed) as info:
        cluster = tfonspark.run(
            sc, _never_runs, _FailsToUnpickle(), 2, input_mode=InputMode.SPARK, reservation_timeout=120
        )
        cluster.shutdown(timeout=120)
    assert "tf_args cannot be rebuilt in the TF process" in str(info.value) + info.value.traceback
    assert wait_until(lambda: not set(feed_socket_dirs()) - before, 10), (
        f"feed sockets left behind: {sorted(set(feed_socket_dirs()) - before)}"
    )


def _serve(args, ctx):
    import time

    time.sleep(600)  # stopped by the driver (or by its supervisor's death)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkilled_supervisor_takes_its_tf_process_and_socket_along(sc, no_leftovers):
    cluster = tfonspark.run(sc, _serve, None, 2, input_mode=InputMode.SPARK, tensorboard=True, reservation_timeout=120)
    try:
        victim = next(n for n in cluster.server.nodes.values() if (n.role.job_name, n.role.task_index) == ("worker", 0))
        up = victim.up
        assert up is not None and up.data_path and os.path.exists(up.data_path)
        assert up.tensorboard_url and "0.0.0.0" not in up.tensorboard_url
        assert up.data_host not in ("", "0.0.0.0", "::")
        tf_process = psutil.Process(up.tf_pid)
        supervisor = supervisor_of(cluster, up.tf_pid)
        assert "tfonspark.executor.supervisor" in " ".join(supervisor.cmdline())
        assert f"--executor {victim.role.executor_id}" in " ".join(supervisor.cmdline())
        assert cluster.cluster_id[:12] in " ".join(supervisor.cmdline())
        children = [p.pid for p in tf_process.children(recursive=True)]  # TensorBoard
        assert children, "the chief should run TensorBoard"
        killed_at = time.monotonic()
        os.kill(supervisor.pid, signal.SIGKILL)
        assert wait_until(lambda: _gone(up.tf_pid), 15), "the TF process outlived its supervisor"
        print(f"[measured] TF process exited {time.monotonic() - killed_at:.2f}s after its supervisor was SIGKILLed")
        assert wait_until(lambda: all(_gone(pid) for pid in children), 15), "TensorBoard outlived the TF process"
        assert not os.path.exists(os.path.dirname(up.data_path)), "the feed socket dir was left behind"
        assert wait_until(lambda: bool(cluster.server.failures()), 30), "the driver did not notice"
    finally:
        with pytest.raises(NodeFailed) as info:
            cluster.shutdown(timeout=120)
    assert "lost" in str(info.value) and (info.value.role, info.value.index) == ("worker", 0)
    assert wait_until(lambda: not node_processes([cluster.cluster_id]), 20)
