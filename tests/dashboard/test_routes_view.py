"""Per-route statistics from request-log records."""

from __future__ import annotations

import pytest

from dashboard.routes_view import route_stats, totals
from gateway.request_log import RequestRecord


def rec(role: str, sender: str | None, path: str, ttft: float, cached: int = 0, saved: float = 0.0) -> RequestRecord:
    return RequestRecord(role, sender, "gemma", path, 1000, cached, cached if path == "transfer" else 0, ttft,
                         50.0 if path == "transfer" else 0.0, saved, None)  # fmt: skip


def test_speedup_is_median_native_over_median_transfer_on_the_route() -> None:
    records = [rec("sum", "smol", "native", t) for t in (900.0, 1000.0, 5000.0)]
    records += [rec("sum", "smol", "transfer", t, cached=800, saved=400.0) for t in (200.0, 250.0)]
    (route,) = route_stats(records)
    assert route.requests == 5 and route.paths == {"native": 3, "prefix": 0, "transfer": 2}
    assert route.ttft_native_ms == 1000.0 and route.ttft_transfer_ms == 225.0
    assert route.native_scope == "route" and route.speedup == pytest.approx(1000.0 / 225.0)
    assert route.tokens_saved == 1600 and route.seconds_saved == pytest.approx(0.8)
    assert route.label == "sum: smol -> gemma"


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
