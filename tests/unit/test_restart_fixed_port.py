"""A restart (``max_restarts``) with a fixed ``server_port`` binds that port again (issue 21, row 3).

Before SO_REUSEADDR on the rendezvous server's socket the restart ended in ``ConfigError``
"Address already in use": the last attempt's connections on the port were in TIME-WAIT.
"""

from __future__ import annotations

from tfonspark.testing import free_ports

from .test_restarts import fail_first_attempt, run


def test_a_restart_binds_the_fixed_server_port_again(tmp_path):
    (port,) = free_ports()
    args = {"dir": str(tmp_path), "failing_attempts": 1, "how": "raise", "sleep": 3}
    cluster = run(fail_first_attempt, args, max_restarts=1, server_port=port)
    cluster.shutdown(timeout=60)
    assert cluster.restarts == 1 and cluster.failure is None
    assert cluster.server.address[1] == port  # the second attempt's server, on the same port
