"""gcpause.py: paused() restores the garbage collector's state it found."""

from __future__ import annotations

import gc

import pytest

from tfonspark.gcpause import paused


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_restores_the_state_it_found(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(ValueError), paused():
            assert not gc.isenabled()
            raise ValueError
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
