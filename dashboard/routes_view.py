"""Per-route statistics for the overview, from the request log.

A route is (role, sender engine, receiver engine): the sender is the engine of the conversation's
previous turn when the hop planner read it, else none (a first hop, or a request without reuse).
The speedup is median native TTFT over median transfer TTFT. Where a route has no native request
of its own, the native median is the role's, over all its routes (``native_scope == "role"``):
same receiver engine, but other prompts. Where the role has none either (every hop transferred),
it is estimated per transferred request as its TTFT plus the prefill time it saved
(``native_scope == "estimate"``; the gateway's estimate: the engine's measured prefill rate times
the cached tokens, net of the transfer). The page marks both.

``with_drift`` adds the shadow drift of the adapter version serving a route: the active version for
its (sender, receiver) engines. A route is ``drifted`` under the condition that raises the
``adapter.drift`` alert (``ShadowSettings.drifted``); the page marks the row, and raises nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import median
from typing import Literal

from dashboard.adapters_view import Drift
from gateway.request_log import RequestRecord
from gateway.settings import ShadowSettings

PATHS = ("native", "prefix", "transfer", "map_quote", "quote")
HOPS = ("transfer", "map_quote", "quote")  # the cross-model paths (gateway/hop.py)
Scope = Literal["route", "role", "estimate"]


@dataclass(frozen=True)
class RouteStats:
    role: str
    sender: str | None
    receiver: str
    requests: int
    paths: dict[str, int]  # path -> requests, every path in PATHS present
    ttft_native_ms: float | None
    ttft_transfer_ms: float | None
    native_scope: Scope | None  # where the native median came from
    tokens_saved: int  # prompt tokens not prefilled (cached: prefix reuse or transfer)
    seconds_saved: float  # estimated prefill time saved, net of transfer time (may be negative)
    drift: Drift | None = None  # of the active version for (sender, receiver); see with_drift
    drifted: bool = False

    @property
    def label(self) -> str:
        return f"{self.role}: {self.sender or '-'} -> {self.receiver}"

    @property
    def speedup(self) -> float | None:
        if self.ttft_native_ms is None or not self.ttft_transfer_ms:
            return None
        return self.ttft_native_ms / self.ttft_transfer_ms


@dataclass(frozen=True)
class Totals:
    requests: int
    transfers: int
    tokens_saved: int
    seconds_saved: float


def _median(values: Sequence[float]) -> float | None:
    return float(median(values)) if values else None


def route_stats(records: Iterable[RequestRecord]) -> list[RouteStats]:
    """One row per route, ordered by role, then sender, then receiver."""
    by_route: dict[tuple[str, str | None, str], list[RequestRecord]] = defaultdict(list)
    native_by_role: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_route[(r.role, r.sender, r.receiver)].append(r)
        if r.path == "native":
            native_by_role[r.role].append(r.ttft_ms)
    out = []
    for (role, sender, receiver), rows in sorted(by_route.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
        counts = Counter(r.path for r in rows)
        own_native = [r.ttft_ms for r in rows if r.path == "native"]
        transfers = [r for r in rows if r.path in HOPS]
        scope: Scope | None = "route" if own_native else None
        native = _median(own_native)
        if native is None and native_by_role[role]:
            native, scope = _median(native_by_role[role]), "role"
        if native is None and transfers:
            native, scope = _median([r.ttft_ms + r.prefill_ms_saved for r in transfers]), "estimate"
        stats = RouteStats(
            role=role, sender=sender, receiver=receiver, requests=len(rows),
            paths={p: counts.get(p, 0) for p in PATHS}, ttft_native_ms=native,
            ttft_transfer_ms=_median([r.ttft_ms for r in transfers]),
            native_scope=scope, tokens_saved=sum(r.cached_tokens for r in rows),
            seconds_saved=sum(r.prefill_ms_saved for r in rows) / 1000,
        )  # fmt: skip
        out.append(stats)
    return out


def with_drift(routes: Iterable[RouteStats], drift: Mapping[tuple[str, str], Drift],
               shadow: ShadowSettings) -> list[RouteStats]:  # fmt: skip
    """``routes`` with the drift of the version serving each: ``drift`` maps (sender engine, receiver
    engine) to their active version's (``adapters_view.active_drift``). None for a first hop, or a
    pair without an active version."""
    out = []
    for r in routes:
        d = drift.get((r.sender, r.receiver)) if r.sender is not None else None
        drifted = d is not None and d.mean_kl is not None and shadow.drifted(d.samples, d.mean_kl)
        out.append(replace(r, drift=d, drifted=drifted))
    return out


def totals(routes: Sequence[RouteStats]) -> Totals:
    return Totals(
        requests=sum(r.requests for r in routes),
        transfers=sum(r.paths[p] for r in routes for p in HOPS),
        tokens_saved=sum(r.tokens_saved for r in routes),
        seconds_saved=sum(r.seconds_saved for r in routes),
    )
