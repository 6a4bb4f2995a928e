"""Store events described for the live feed, and active alerts."""

from __future__ import annotations

import json

from dashboard.feed import active_alerts, describe
from store.events import Event


def test_transfer_shows_up_as_its_prefill_saved_event() -> None:
    item = describe(Event("5-0", "prefill.saved", {"ts": "100.5", "tokens": "900", "ms": "812.0", "path": "transfer",
                                                   "role": "summarizer"}))  # fmt: skip
    assert item.title == "transfer" and "summarizer" in item.text and "900" in item.text and item.ts == 100.5
    data = item.sse().decode()
    assert data.startswith("id: 5-0\nevent: hf\ndata: ") and data.endswith("\n\n")
    assert json.loads(data.split("data: ", 1)[1])["kind"] == "prefill.saved"


def test_oom_eviction_and_rollback_events_have_their_severity() -> None:
    oom = describe(Event("1-0", "oom.alert", {"ts": "1", "reason": "no_space", "tier": "cpu,ssd", "detail": "x"}))
    evicted = describe(Event("2-0", "kv.evicted", {"ts": "1", "tier": "cpu", "reason": "budget"}))
    fields = {"ts": "1", "action": "rollback", "version": "v1", "adapter": "1", "from": "active", "to": "active",
              "actor": "dashboard"}  # fmt: skip
    back = describe(Event("3-0", "adapter.status", fields))
    assert (oom.severity, oom.title) == ("alert", "OOM alert") and "no_space" in oom.text
    assert (evicted.severity, evicted.title) == ("warn", "eviction")
    assert back.title == "rollback" and "v1" in back.text


def test_failed_fit_is_an_alert_naming_the_direction_attempts_and_error() -> None:
    fields = {"ts": "990", "sender": "smollm2-135m-instruct", "receiver": "qwen2.5-coder-0.5b-instruct",
              "method": "kv-ridge", "attempts": "3", "error": "ValueError: singular matrix"}  # fmt: skip
    item = describe(Event("4-0", "fit.failed", fields))
    assert (item.severity, item.title) == ("alert", "fit failed")
    assert item.text == ("smollm2-135m-instruct -> qwen2.5-coder-0.5b-instruct (kv-ridge) failed after 3 attempts: "
                         "ValueError: singular matrix")  # fmt: skip
    assert "after 1 attempt:" in describe(Event("5-0", "fit.failed", {**fields, "attempts": "1"})).text
    assert [a.kind for a in active_alerts([Event("4-0", "fit.failed", fields)], now=1000.0, window_s=60.0)] == [
        "fit.failed"
    ]


def test_unknown_kinds_are_shown_with_their_fields() -> None:
    item = describe(Event("1-0", "something.new", {"ts": "x", "a": "1"}))
    assert item.title == "something.new" and "a=1" in item.text and item.ts == 0.0


def test_active_alerts_are_recent_alert_kinds_only() -> None:
    events = [
        Event("3-0", "oom.alert", {"ts": "990", "reason": "no_space"}),
        Event("2-0", "kv.stored", {"ts": "995"}),
        Event("1-0", "adapter.drift", {"ts": "100", "version": "v1"}),  # too old
    ]
    alerts = active_alerts(events, now=1000.0, window_s=60.0)
    assert [a.kind for a in alerts] == ["oom.alert"]
