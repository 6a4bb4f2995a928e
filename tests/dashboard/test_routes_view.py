"""Per-route statistics from request-log records, and the drift of the adapter serving each route."""

from __future__ import annotations

import pytest

from dashboard.adapters_view import Drift
from dashboard.routes_view import route_stats, totals, with_drift
from gateway.request_log import RequestRecord
from gateway.settings import ShadowSettings


def rec(role: str, sender: str | None, path: str, ttft: float, cached: int = 0, saved: float = 0.0) -> RequestRecord:
    return RequestRecord(role, sender, "gemma", path, 1000, cached, cached if path == "transfer" else 0, ttft,
                         50.0 if path == "transfer" else 0.0, saved, None)  # fmt: skip


def test_speedup_is_median_native_over_median_transfer_on_the_route() -> None:
    records = [rec("sum", "smol", "native", t) for t in (900.0, 1000.0, 5000.0)]
    records += [rec("sum", "smol", "transfer", t, cached=800, saved=400.0) for t in (200.0, 250.0)]
    (route,) = route_stats(records)
    assert route.requests == 5
    assert route.paths == {"native": 3, "prefix": 0, "transfer": 2, "map_quote": 0, "quote": 0}
    assert route.ttft_native_ms == 1000.0 and route.ttft_transfer_ms == 225.0
    assert route.native_scope == "route" and route.speedup == pytest.approx(1000.0 / 225.0)
    assert route.tokens_saved == 1600 and route.seconds_saved == pytest.approx(0.8)
    assert route.label == "sum: smol -> gemma"


def test_quote_hops_count_as_cross_model_hops_in_the_transfer_median() -> None:
    records = [rec("sum", "smol", "native", 1000.0), rec("sum", "smol", "transfer", 300.0, cached=800)]
    records += [rec("sum", "smol", "quote", 100.0), rec("sum", "smol", "map_quote", 200.0)]
    (route,) = route_stats(records)
    assert route.paths == {"native": 1, "prefix": 0, "transfer": 1, "map_quote": 1, "quote": 1}
    assert route.ttft_transfer_ms == 200.0 and route.speedup == pytest.approx(5.0)
    assert totals([route]).transfers == 3


def test_route_without_native_requests_uses_the_roles_native_median() -> None:
    records = [rec("sum", None, "native", 800.0), rec("sum", "smol", "transfer", 200.0, cached=700)]
    by_sender = {r.sender: r for r in route_stats(records)}
    transfer = by_sender["smol"]
    assert transfer.native_scope == "role" and transfer.ttft_native_ms == 800.0 and transfer.speedup == 4.0
    assert by_sender[None].speedup is None  # native only: nothing to compare


def test_role_without_native_requests_estimates_native_from_the_prefill_its_transfers_saved() -> None:
    records = [rec("sum", "smol", "transfer", t, cached=700, saved=s) for t, s in ((200.0, 600.0), (300.0, 900.0))]
    (route,) = route_stats(records)
    assert route.native_scope == "estimate" and route.ttft_native_ms == 1000.0  # median of 800 and 1200
    assert route.speedup == pytest.approx(1000.0 / 250.0)


def test_native_only_routes_have_no_speedup() -> None:
    (route,) = route_stats([rec("sum", None, "native", 200.0), rec("sum", None, "prefix", 50.0, cached=100)])
    assert route.native_scope == "route" and route.ttft_transfer_ms is None and route.speedup is None


def test_totals_add_up_the_routes() -> None:
    records = [rec("a", None, "native", 1.0), rec("b", "x", "transfer", 1.0, cached=10, saved=-20.0)]
    t = totals(route_stats(records))
    assert (t.requests, t.transfers, t.tokens_saved) == (2, 1, 10)
    assert t.seconds_saved == pytest.approx(-0.02)  # net: a transfer slower than the prefill it replaced


SHADOW = ShadowSettings(drift_kl_threshold=0.5, min_samples=5)


def test_route_carries_the_drift_of_the_active_version_for_its_engines() -> None:
    records = [rec("sum", "smol", "native", 1000.0), rec("sum", "smol", "transfer", 250.0, cached=800)]
    records += [rec("sum", None, "native", 900.0), rec("rev", "qwen", "transfer", 300.0, cached=700)]
    drift = {("smol", "gemma"): Drift(7, "v1", 12, 0.21, 0.93), ("qwen", "gemma"): Drift(9, "v3", 0, None, None)}
    rows = {(r.role, r.sender): r for r in with_drift(route_stats(records), drift, SHADOW)}
    smol = rows[("sum", "smol")]
    assert smol.drift == Drift(7, "v1", 12, 0.21, 0.93) and not smol.drifted
    assert smol.speedup == pytest.approx(4.0) and smol.requests == 2  # the rest of the row is unchanged
    qwen = rows[("rev", "qwen")]
    assert qwen.drift is not None and qwen.drift.samples == 0 and not qwen.drifted  # an adapter, no samples yet
    assert rows[("sum", None)].drift is None and not rows[("sum", None)].drifted  # a first hop: no adapter


def test_route_is_drifted_only_under_the_drift_alerts_condition() -> None:
    records = [rec(role, "smol", "transfer", 200.0, cached=800) for role in ("a", "b")]
    records += [rec("c", "qwen", "transfer", 200.0, cached=800), rec("d", "gemma3", "transfer", 200.0, cached=800)]
    drift = {
        ("smol", "gemma"): Drift(1, "v1", 5, 0.51, 0.4),  # over the threshold with min_samples: the alert's condition
        ("qwen", "gemma"): Drift(2, "v2", 4, 0.9, 0.3),  # over it, but too few samples to alert
        ("gemma3", "gemma"): Drift(3, "v3", 50, 0.5, 0.8),  # at the threshold, not over it
    }
    drifted = {r.role: r.drifted for r in with_drift(route_stats(records), drift, SHADOW)}
    assert drifted == {"a": True, "b": True, "c": False, "d": False}
    assert SHADOW.drifted(5, 0.51) and not SHADOW.drifted(4, 0.9) and not SHADOW.drifted(50, 0.5)
