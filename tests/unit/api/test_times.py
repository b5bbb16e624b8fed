"""The one RFC 3339 helper of both programs."""

from __future__ import annotations

from dra_api import times


def test_formats_whole_seconds_in_utc() -> None:
    assert times.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert times.rfc3339(1795790375.9) == "2026-11-27T14:39:35Z"


def test_reads_what_the_api_server_and_kopf_write() -> None:
    assert times.parse("1970-01-01T00:01:00Z") == 60.0
    assert times.parse("1970-01-01T00:01:00.5+00:00") == 60.5
    assert times.parse("1970-01-01T01:01:00+01:00") == 60.0
    assert times.parse("1970-01-01T00:01:00") == 60.0  # no zone: UTC
    assert times.parse(times.rfc3339(1795790375)) == 1795790375.0


def test_anything_else_is_none() -> None:
    for text in ("", "yesterday", "2026-13-01T00:00:00Z", "2026-11-27T14:28:41Z\n"):
        assert times.parse(text) is None
