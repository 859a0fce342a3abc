"""testing/hosts.py: hosts as network namespaces, made and removed whole.

The settings are checked before anything is made; on a machine where namespaces can be made
(root, ``ip``, ``unshare``), two worker hosts are built, each with its own address and hostname,
resolving every other host by name, reaching another host over the bridge and cut off from it by
``cut``; ``down`` leaves nothing (namespaces, links, ``/etc/netns`` entries), also when a
process still runs on a host. ``tests/integration/test_hosts.py`` runs Spark and tfonspark there.
"""

from __future__ import annotations

import sys

import pytest

from tfonspark.errors import ConfigError
from tfonspark.testing.hosts import Host, Hosts, main, unavailable

PREFIX, SUBNET = "tfosu", "10.233.0"  # apart from the CLI's default and the integration test's


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"workers": 0}, "1 to 200 worker hosts"),
        ({"workers": True}, "1 to 200 worker hosts"),
        ({"prefix": "Bad_Name"}, "a hosts prefix"),
        ({"prefix": "waytoolong"}, "a hosts prefix"),
        ({"subnet": "10.0.0.0"}, "a hosts subnet"),
        ({"subnet": "10.300.0"}, "a hosts subnet"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_made(kwargs, said):
    with pytest.raises(ConfigError, match=said):
        Hosts(**kwargs)


def test_the_hosts_are_named_and_numbered_by_role():
    hosts = Hosts(workers=2, prefix=PREFIX, subnet=SUBNET)
    assert [(h.name, h.address) for h in hosts.all] == [
        ("tfosu-driver", "10.233.0.10"),
        ("tfosu-master", "10.233.0.11"),
        ("tfosu-h1", "10.233.0.21"),
        ("tfosu-h2", "10.233.0.22"),
    ]
    assert len({h.link for h in hosts.all}) == 4 and all(h.link.startswith("tfosu-") for h in hosts.all)


def test_a_command_runs_in_the_hosts_namespace_with_its_hostname():
    argv = Host("tfosu-h1", "10.233.0.21", "tfosu-v21").command(["python", "-c", "print(1)"])
    assert argv[:4] == ["ip", "netns", "exec", "tfosu-h1"] and argv[-3:] == ["python", "-c", "print(1)"]
    assert "--uts" in argv and "tfosu-h1" in argv[4:]


@pytest.fixture
def made():
    why = unavailable()
    if why:
        pytest.skip(why)
    hosts = Hosts(workers=2, prefix=PREFIX, subnet=SUBNET)
    with hosts:
        yield hosts
    assert hosts.leftovers() == {"namespaces": [], "links": [], "etc": []}


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_each_host_has_its_own_name_and_address_and_resolves_the_others(made):
    h1, h2 = made.workers
    done = made.run(h1, _py("import socket; print(socket.gethostname(), socket.gethostbyname('tfosu-h2'))"), 30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tfosu-h1", h2.address]
    addresses = made.run(h2, ["ip", "-4", "-o", "addr", "show"], 30).stdout
    assert f"{h2.address}/24" in addresses and "127.0.0.1" in addresses and h1.address not in addresses


def test_a_host_reaches_another_over_the_bridge_until_it_is_cut_off(made):
    h1, h2 = made.workers
    server = made.popen(h2, _py("import socket,time; s=socket.create_server(('0.0.0.0', 5555)); time.sleep(60)"))
    probe = _py(f"import socket; socket.create_connection(('{h2.address}', 5555), timeout=2).close(); print('ok')")
    for _ in range(50):  # the server starts in its own namespace
        if made.run(h1, probe, 30).stdout.strip() == "ok":
            break
    else:
        pytest.fail("h1 never reached h2's server")
    made.cut(h2)
    assert made.run(h1, probe, 30).returncode != 0  # a timeout: nothing answers, nothing refuses
    made.restore(h2)
    assert made.run(h1, probe, 30).stdout.strip() == "ok"
    assert server.pid in made.processes(h2)


def test_down_removes_every_host_and_stops_what_runs_there(made):
    proc = made.popen(made.workers[0], ["sleep", "300"])
    made.down()
    assert proc.poll() is not None and made.leftovers() == {"namespaces": [], "links": [], "etc": []}


def test_the_command_line_brings_hosts_up_and_down(capsys):
    why = unavailable()
    if why:
        pytest.skip(why)
    try:
        assert main(["up", "--workers", "1", "--prefix", PREFIX, "--subnet", SUBNET]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert ["tfosu-h1", "10.233.0.21"] in [line.split()[:2] for line in lines] and "3 hosts" in lines[-1]
    finally:
        assert main(["down", "--prefix", PREFIX]) == 0
    assert "0 hosts, 0 links of prefix 'tfosu'" in capsys.readouterr().out
