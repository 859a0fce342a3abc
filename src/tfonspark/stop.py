"""``python -m tfonspark.stop``: ask a running cluster to stop its streams (TFoS ``request_stop``).

::

    python -m tfonspark.stop /path/to/stop-file.json          # written by cluster.write_stop_file()
    TFONSPARK_STOP_SECRET=<hex> python -m tfonspark.stop --address host:port

The secret is never taken from the command line (other users can read it in ``ps``): it comes
from the stop file, or from the ``TFONSPARK_STOP_SECRET`` environment variable with
``--address``. Exit status 0 once the driver acknowledged the request, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .driver.nodes.stopping import request_stop
from .errors import TFoSError

__all__ = ["SECRET_ENV_VAR", "main"]

SECRET_ENV_VAR = "TFONSPARK_STOP_SECRET"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tfonspark.stop",
        description="Ask a running tfonspark cluster to stop its streams; the driver's "
        "cluster.shutdown(ssc or query) then stops them gracefully and ends training.",
    )
    parser.add_argument("stop_file", nargs="?", help="the stop file the driver wrote (cluster.write_stop_file())")
    parser.add_argument(
        "--address", help=f"the driver's rendezvous address host:port (the secret comes from ${SECRET_ENV_VAR})"
    )
    parser.add_argument("--reason", default="", help="why, for the driver's log")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the driver (%(default)s)")
    args = parser.parse_args(argv)
    if bool(args.stop_file) == bool(args.address):
        parser.error("give either a stop file or --address (not both)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Send the stop request; return the process exit status (0: acknowledged)."""
    args = _parse_args(argv)
    try:
        if args.address:
            secret = os.environ.get(SECRET_ENV_VAR, "")
            if not secret:
                print(f"--address needs the cluster secret (hex) in ${SECRET_ENV_VAR}", file=sys.stderr)
                return 1
            request_stop(args.address, secret, reason=args.reason, timeout=args.timeout)
        else:
            request_stop(args.stop_file, reason=args.reason, timeout=args.timeout)
    except TFoSError as err:
        print(f"stop request failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print("stop requested: the driver acknowledged it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
