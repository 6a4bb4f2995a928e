"""Prometheus metrics of one gateway: prefix ``heterofold_``, base units, counters end in ``_total``,
labels of low cardinality (roles, paths, model pairs, reasons, tiers, adapter versions, fit methods).

Each app owns its registry, so two apps in one process (tests) never share counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TRANSFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _TierCollector(Collector):
    """Tier bytes used and budget, read from the store when scraped."""

    def __init__(self, usage: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self.usage = usage

    def collect(self) -> Iterable[GaugeMetricFamily]:
        used = GaugeMetricFamily("heterofold_tier_bytes", "KV bytes held per store tier", labels=["tier"])
        budget = GaugeMetricFamily("heterofold_tier_budget_bytes", "Byte budget per store tier", labels=["tier"])
        try:
            rows = list(self.usage())
        except Exception:  # the store being down must not break the scrape
            rows = []
        for tier, u, b in rows:
            used.add_metric([tier], u)
            budget.add_metric([tier], b)
        yield used
        yield budget


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("heterofold_requests_total", "Chat requests answered", ["role", "path"], registry=r)
        self.errors = Counter("heterofold_request_errors_total", "Chat requests that failed", ["role", "code"],
                              registry=r)  # fmt: skip
        self.ttft = Histogram("heterofold_ttft_seconds", "Time to first token at the gateway", ["role", "path"],
                              buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.transfer = Histogram("heterofold_transfer_seconds", "Cross-model KV transfer (align, map, recompute)",
                                  ["route"], buckets=TRANSFER_BUCKETS, registry=r)  # fmt: skip
        self.transferred_tokens = Counter("heterofold_transferred_tokens_total", "Receiver tokens built by transfer",
                                          ["route"], registry=r)  # fmt: skip
        self.prefill_tokens_saved = Counter("heterofold_prefill_tokens_saved_total",
                                            "Prompt tokens not prefilled (prefix reuse or transfer)", ["role", "path"],
                                            registry=r)  # fmt: skip
        self.prefill_seconds_saved = Counter("heterofold_prefill_seconds_saved_total",
                                             "Estimated prefill time saved, net of transfer time", ["role", "path"],
                                             registry=r)  # fmt: skip
        self.fallbacks = Counter("heterofold_transfer_fallbacks_total",
                                 "Transfer or reuse attempts that fell back to native prefill", ["stage", "reason"],
                                 registry=r)  # fmt: skip
        self.store_puts = Counter("heterofold_kv_puts_total", "Turn KV values offered to the store", ["outcome"],
                                  registry=r)  # fmt: skip
        self.evictions = Counter("heterofold_kv_evictions_total", "KV values evicted from the store", ["reason"],
                                 registry=r)  # fmt: skip
        self.oom_alerts = Counter("heterofold_oom_alerts_total", "Store OOM alerts", ["reason"], registry=r)
        self.drift_kl = Gauge("heterofold_adapter_drift_first_token_kl", "Mean first-token KL vs native (shadow)",
                              ["version"], registry=r)  # fmt: skip
        self.drift_top1 = Gauge("heterofold_adapter_top1_agreement", "Mean top-1 agreement vs native (shadow)",
                                ["version"], registry=r)  # fmt: skip
        self.shadow_samples = Counter("heterofold_shadow_samples_total", "Shadow evaluations run", ["version"],
                                      registry=r)  # fmt: skip
        self.drift_alerts = Counter("heterofold_drift_alerts_total", "Adapter drift alerts", ["version"], registry=r)
        self.auto_promotions = Counter("heterofold_auto_promotions_total",
                                       "Shadow versions promoted on paired shadow evaluation", ["version"],
                                       registry=r)  # fmt: skip
        self.fit_failures = Counter("heterofold_fit_failures_total", "Fit jobs that failed their last attempt",
                                    ["method"], registry=r)  # fmt: skip
        self.rate_limited = Counter("heterofold_rate_limited_total", "Requests answered 429 (engine queue full)",
                                    ["engine"], registry=r)  # fmt: skip
        self.storage_hits = Counter("heterofold_storage_hits_total", "KV imports SGLang loaded from HiCache storage",
                                    ["engine"], registry=r)  # fmt: skip
        self.storage_hit_tokens = Counter("heterofold_storage_hit_tokens_total",
                                          "Prompt tokens SGLang loaded from HiCache storage", ["engine"],
                                          registry=r)  # fmt: skip

    def watch_tiers(self, usage: Callable[[], Sequence[tuple[str, int, int]]]) -> None:
        self.registry.register(_TierCollector(usage))

    def watch_background(self, pending: Callable[[], int]) -> None:
        """After-turn work (storing turns' KV, shadow runs) not yet finished on this replica."""
        gauge = Gauge("heterofold_background_pending", "After-turn tasks not yet finished", registry=self.registry)
        gauge.set_function(lambda: float(pending()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
