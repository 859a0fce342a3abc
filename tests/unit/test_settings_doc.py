"""settings_doc.py: the settings page lists every setting in one table, and every derived wait."""

from __future__ import annotations

from pathlib import Path

from tfonspark import settings, settings_doc

REPO = Path(__file__).resolve().parents[2]


def test_the_settings_doc_lists_every_setting_in_one_table():
    doc = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    assert doc.count(settings_doc.markdown_table()) == 1


def test_the_settings_doc_lists_every_derived_wait():
    """Every wait that follows from a setting is named in docs/settings.md (issue 43, row 0)."""
    doc = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    assert doc.count(settings_doc.derived_waits_table()) == 1
    assert settings.pace_interval(600) == 150 and settings.pace_quiet_limit(600) == 300
    assert settings.feed_hold_limit(600) == 905 and settings.feed_connect_timeout(10) == 10
    assert settings.heartbeat_interval(60) == 5 and settings.heartbeat_interval(8) == 2
