"""The warm spare kept across a whole-cluster restart (executor/spare.py): its keeper's rules.

The spare imports a stand-in ``tensorflow`` (an empty package first on its ``PYTHONPATH``), so
it is ready at once; what is checked is the keeper: discarded without ``keep``, handed over once
to an adopter whose environment matches, its exit status (a signal included) reported to the
adopter, killed when the adopter goes, and gone once nobody came within its wait. Then which
nodes keep a spare, and when it is kept for the next attempt.
"""

from __future__ import annotations

import os
import shutil
import signal
import types
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tfonspark.config import NodeConfig
from tfonspark.driver.ending import finish, stop_now
from tfonspark.driver.nodes.restarts import Attempts
from tfonspark.executor.relay import Relay
from tfonspark.executor.spare import Keeper, adopt, env_digest
from tfonspark.executor.supervisor import Life, Supervisor
from tfonspark.host import process_alive
from tfonspark.wire import messages as m

WAIT = 1.0  # how long a kept spare waits for an adopter here


@pytest.fixture
def started(tmp_path: Path):
    """A keeper at ``tmp_path/k.sock`` with its spare's scratch dir and environment."""
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("")
    scratch = tmp_path / "tfos-node-spare"
    scratch.mkdir()
    path = str(tmp_path / "k.sock")
    python_path = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=python_path)
    keeper = Keeper.start(path, env, ["--cluster", "spare-test"], wait=WAIT)
    assert wait_until(lambda: os.path.exists(path), 20.0), "the keeper never listened"
    yield keeper, path, env, scratch
    if keeper.proc.poll() is None:
        keeper.proc.kill()
        keeper.proc.wait()


def test_discarded_without_keep(started) -> None:
    keeper, path, _, scratch = started
    keeper.release(keep=False)
    assert keeper.proc.returncode == 0
    assert not os.path.exists(path) and not scratch.exists()


def test_kept_then_gone_when_nobody_comes(started) -> None:
    keeper, path, _, scratch = started
    keeper.release(keep=True)
    assert keeper.proc.poll() is None and os.path.exists(path)  # waiting for the next attempt
    assert wait_until(lambda: keeper.proc.poll() is not None, WAIT + 10)
    assert not os.path.exists(path) and not scratch.exists()


def test_adopted_once_reports_a_signal_and_ends_its_keeper(started) -> None:
    keeper, path, env, scratch = started
    keeper.release(keep=True)
    spare = adopt([str(Path(path).with_name("none.sock")), path], env_digest(dict(env, TF_CONFIG="{}")))
    assert spare is not None and process_alive(spare.pid)
    assert spare.scratch == str(scratch) and not os.path.exists(path)  # nobody else gets it
    assert adopt([path], env_digest(env)) is None
    spare.set_env({"TF_CONFIG": "{}"})  # then it waits for its bootstrap
    assert spare.poll() is None
    os.killpg(spare.pid, signal.SIGKILL)
    assert spare.wait(10) == -signal.SIGKILL
    assert wait_until(lambda: keeper.proc.poll() is not None, 20.0)
    spare.discard()


def test_another_environment_is_refused_and_the_spare_killed(started) -> None:
    keeper, path, env, scratch = started
    assert adopt([path], env_digest(dict(env, CUDA_VISIBLE_DEVICES="1"))) is None
    assert wait_until(lambda: keeper.proc.poll() is not None, 20.0)
    assert not scratch.exists()


def test_killed_when_its_adopter_goes(started) -> None:
    keeper, path, env, scratch = started
    spare = adopt([path], env_digest(env))
    assert spare is not None
    pid = spare.pid
    spare.discard()  # as when the adopting supervisor dies: its connection closes
    assert wait_until(lambda: not process_alive(pid), 20.0) and wait_until(lambda: keeper.proc.poll() is not None, 20.0)
    assert not scratch.exists()


# ---- who keeps a spare, and when it is kept ---------------------------------------------------
def _config(**overrides) -> NodeConfig:
    fields = {"cluster_id": "spare-test", "driver_host": "127.0.0.1", "driver_port": 1, "secret_hex": "0" * 32}
    return NodeConfig(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("job", "keep", "server_restarts", "spark", "wanted"),
    [
        ("worker", True, 0, True, True),
        ("chief", True, 0, True, True),
        ("worker", False, 0, True, False),  # the last attempt, or max_restarts=0
        ("worker", True, 3, True, False),  # restarts in place with its standby instead
        ("ps", True, 0, True, False),
        ("evaluator", True, 0, True, False),
        ("worker", True, 0, False, False),  # no Spark executor to find it by
    ],
)
def test_which_nodes_keep_a_spare(monkeypatch, job, keep, server_restarts, spark, wanted) -> None:
    if spark:
        monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-test")
    else:
        monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    sup = Supervisor(_config(keep_spare=keep, server_restarts=server_restarts), 0, [], b"")
    sup.job_name = job
    assert sup.spares.wanted(sup.job_name) is wanted


@pytest.mark.parametrize("on", [True, False])
def test_spare_processes_off_keeps_neither_a_spare_nor_a_standby(monkeypatch, on) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-test")
    trainer = Supervisor(_config(keep_spare=True, spare_processes=on), 0, [], b"")
    server = Supervisor(_config(server_restarts=3, spare_processes=on), 0, [], b"")
    trainer.job_name = server.job_name = "worker"
    assert (trainer._successor(), server._successor()) == (("spare", "standby") if on else ("", ""))
    trainer.in_place.restarts = 1  # a restart in place keeps no spare (only the first TF process does)
    assert trainer._successor() == ""


@pytest.mark.parametrize(
    ("ended", "executor_gone", "kept"),
    [
        ((1, "Traceback"), "", True),  # map_fun failed
        ((-9, ""), "", True),  # killed
        ((-15, ""), "", True),  # stopped for another node's failure
        ((0, ""), "", False),  # done: no restart follows
        (None, "", False),  # could not start
        ((-15, ""), "the executor exited", False),  # its executor is gone: the spare goes with it
    ],
)
def test_a_spare_is_kept_only_after_a_failure(ended, executor_gone, kept) -> None:
    released: list[bool] = []
    sup = Supervisor(_config(keep_spare=True), 0, [], b"")
    sup.spares.keeper = types.SimpleNamespace(release=lambda keep: released.append(keep))  # type: ignore[assignment]
    if executor_gone:
        sup.life = Life.EXECUTOR_GONE
    sup._release_spare(ended)
    assert released == [kept] and sup.spares.keeper is None


@pytest.mark.parametrize(("final", "kept"), [(False, True), (True, False)])
def test_a_stop_for_good_discards_the_spare_at_once(pair, final, kept) -> None:
    """Stopped for another node's failure, the spare waits for the next attempt; stopped for good
    (``cluster.stop()``, the end: ``Stop(final=True)``), it goes now, not after its wait."""
    sup_end, drv_end = pair
    sup = Supervisor(_config(keep_spare=True), 0, [], b"")  # no TF process: nothing to signal
    released: list[bool] = []
    sup.spares.keeper = types.SimpleNamespace(release=lambda keep: released.append(keep))  # type: ignore[assignment]
    m.send_message(drv_end, m.Stop(2.0, final))
    sup._obey_driver(Relay(sup_end, 0))  # returns once the Stop arrived
    sup._release_spare((-15, ""))  # its TF process ended by that Stop's SIGTERM
    assert released == [kept]


def test_the_driver_stops_for_good_only_where_no_restart_follows() -> None:
    finals: list[bool] = []
    gang = types.SimpleNamespace(
        check=lambda: None,
        closed=False,
        nodes=lambda: [],  # the control plane's node table: no evaluator to stop first
        teardown=lambda grace_secs, final=False: finals.append(final),
    )
    streams = types.SimpleNamespace(join=lambda timeout: None, finish=lambda ssc, timeout: (True, None))
    stop_now(types.SimpleNamespace(gang=gang), streams, 2.0)  # cluster.stop()
    attempts = types.SimpleNamespace(gang=gang, can_restart=lambda: False, run=lambda action: True)
    attempts.give_up = lambda error: error
    finish(attempts, streams, lambda: None, None, 0.0, 10.0)  # cluster.shutdown(): the end
    assert finals == [True, True]


def test_the_driver_asks_for_spares_while_a_restart_may_follow() -> None:
    gang = types.SimpleNamespace(config=_config())
    attempts = Attempts(gang, 2, lambda attempt: gang, None, lambda: True)
    for attempt, keep in [(0, True), (1, True), (2, False)]:
        attempts._mark_spares(attempt)
        assert gang.config.keep_spare is keep, attempt
    never = Attempts(gang, 0, None, None, lambda: True)
    never._mark_spares(0)
    assert gang.config.keep_spare is False


# ---- issue 43, row 6: another user's directory where the keepers listen ------------------------
@pytest.mark.parametrize("planted", ["dir", "symlink"])
def test_a_spare_dir_planted_by_another_user_does_not_stop_the_spares(monkeypatch, request, tmp_path, planted) -> None:
    """Another user made ``$TMPDIR/tfos-spares-<uid>`` first (``/tmp`` is sticky and open to all):
    every supervisor logged "cannot start a spare" and ran without one until root removed it."""
    if os.geteuid() != 0:
        pytest.skip("needs another user's directory: run as root")
    import tempfile

    from tfonspark.executor.spare import spare_paths

    short = Path(tempfile.mkdtemp(prefix="row6-", dir="/tmp"))  # a Unix socket's path has at most 107 bytes
    request.addfinalizer(lambda: shutil.rmtree(short, ignore_errors=True))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    hijacked = short / f"tfos-spares-{os.getuid()}"
    if planted == "dir":
        hijacked.mkdir(mode=0o777)
        os.chown(hijacked, 65534, 65534)  # nobody's, as if nobody had made it
    else:
        mine = short / "mine"
        mine.mkdir(mode=0o700)
        hijacked.symlink_to(mine)  # a link: whoever made it chose where it points
        os.lchown(hijacked, 65534, 65534)
    paths = spare_paths("cluster-row6", "executor-key", 3)
    where = Path(paths[0]).parent
    assert where != hijacked and where.parent == short and where.name.startswith(hijacked.name)
    info = where.lstat()
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700 and not where.is_symlink()
    assert spare_paths("cluster-row6", "executor-key", 3) == paths  # the next supervisor looks there too
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("")
    scratch = tmp_path / "tfos-node-spare"
    scratch.mkdir()
    env = dict(
        os.environ, TMPDIR=str(scratch), PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    )
    keeper = Keeper.start(paths[0], env, ["--cluster", "spare-row6"], wait=WAIT)
    try:
        assert wait_until(lambda: os.path.exists(paths[0]), 20.0), "the keeper never listened"
        keeper.release(keep=True)
        spare = adopt(spare_paths("cluster-row6", "executor-key", 3), env_digest(env))  # the next attempt finds it
        assert spare is not None and process_alive(spare.pid)
        spare.discard()
    finally:
        if keeper.proc.poll() is None:
            keeper.proc.kill()
        keeper.proc.wait()


# ---- issue 43, row 2: the adopted spare gets the reservation itself --------------------------------
def _socket_inode(pid: int, fd: int) -> int:
    """The inode of the socket at ``fd`` in process ``pid`` (0: not a socket)."""
    target = os.readlink(f"/proc/{pid}/fd/{fd}")
    return int(target[len("socket:[") : -1]) if target.startswith("socket:[") else 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_an_adopted_spare_holds_the_reservation_itself(tmp_path, monkeypatch) -> None:
    """The adopter closed its reservation, then bound the spare's own socket: in between, another
    user's bind() took the port (issue 43: 2-14 of 30 adoptions). Now the reserved socket itself
    passes to the spare: the same socket (inode) at its port_fd, bound all along."""
    import socket

    from tfonspark.executor import spare as spare_module
    from tfonspark.ports import reserve_port

    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(spare_module, "SPARE_DELAY_SECS", 0.0)
    cluster = f"row2-unit-{os.getpid()}"
    reserved = reserve_port()
    port, inode = reserved.getsockname()[1], os.fstat(reserved.fileno()).st_ino
    ready = m.ClusterReady("worker", 0, {"worker": [f"127.0.0.1:{port}"]})
    before = Supervisor(_config(keep_spare=True, cluster_id=cluster), 0, [], b"")
    before.spares.keep(ready, before.done)  # what the failed attempt's supervisor did
    assert wait_until(lambda: os.path.exists(before.spares.paths()[0]), 20.0), "the keeper never listened"
    before._release_spare((1, "Traceback"))
    after = Supervisor(_config(attempt=1, cluster_id=cluster), 0, [], b"")
    spare = after.spares.adopt(ready, reserved)
    try:
        assert spare is not None and after.spares.adopted
        assert reserved.fileno() == -1  # no copy of ours: the spare's server alone releases the port
        assert wait_until(lambda: _socket_inode(spare.pid, spare.port_fd) == inode, 20.0)
        for family, address in [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::1")]:
            for reuse in (0, 1):
                with socket.socket(family) as other, pytest.raises(OSError, match="in use"):
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
                    other.bind((address, port))
    finally:
        if spare is not None:
            spare.discard()
