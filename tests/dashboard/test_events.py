"""The SSE endpoint over real HTTP: it resumes after the browser's Last-Event-ID."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.models


def first_event(gateway: Gateway, headers: dict[str, str], params: dict[str, str]) -> dict[str, str]:
    """The first ``hf`` event the stream sends (then the connection is closed)."""
    with httpx.Client(base_url=gateway.url, timeout=30) as client, client.stream(
        "GET", "/dashboard/events", headers=headers, params=params
    ) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in r.iter_lines():
            if not line:
                if fields.get("event") == "hf":
                    return fields
                fields = {}
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    raise AssertionError("the stream ended without an event")


def test_stream_resumes_after_last_event_id(gateway: Gateway) -> None:
    log = gateway.services.store.events
    for handle in ("a", "b"):  # the transport is under test here, not who writes events
        log.emit("kv.evicted", time.time(), handle=handle, tier="cpu", reason="budget")
    events = log.read(count=10_000)
    before, last = events[-2], events[-1]
    got = first_event(gateway, {"Last-Event-ID": before.id}, {"after": "0-0"})  # the header wins over ?after
    assert got["id"] == last.id
    item = json.loads(got["data"])
    assert item["kind"] == last.kind and item["id"] == last.id
    assert first_event(gateway, {}, {"after": "0-0"})["id"] == events[0].id
