"""The request log on a real SQLite registry: rows in, newest first out, a bounded tail kept."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gateway.registry import db as registry_db
from gateway.registry.db import Database
from gateway.request_log import RequestLog, RequestRecord


def record(i: int) -> RequestRecord:
    return RequestRecord("executor", None if i % 2 else "smol", "smol", "native", 100 + i, 0, 0, float(i), 0.0, 0.0,
                         None)  # fmt: skip


def test_request_log_returns_newest_first_and_keeps_a_bounded_tail(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry_db.upgrade(url)
    db = Database(url)
    try:
        log = RequestLog(db, keep=3, prune_every=5)
        for i in range(1, 8):
            asyncio.run(log.record(record(i)))
        got = log.recent(100)
        # pruned at row 5 (rows up to 2 dropped); rows 6 and 7 come after
        assert [r.ttft_ms for r in got] == [7.0, 6.0, 5.0, 4.0, 3.0]
        assert got[0] == record(7)
        assert [r.ttft_ms for r in log.recent(2)] == [7.0, 6.0]
    finally:
        db.close()


def test_a_registry_that_fails_loses_the_row_not_the_request(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = Database(f"sqlite:///{tmp_path / 'never-migrated.db'}")  # no request_log table
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.request_log"):
            asyncio.run(RequestLog(db).record(record(1)))  # returns: the caller's request goes on
        assert [r.getMessage()[:20] for r in caplog.records] == ["request not logged: "]
    finally:
        db.close()
