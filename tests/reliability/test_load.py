"""A bounded run of ``bench/load.py`` (about 20 s): concurrent conversations across the roles and
both families of the suite's models, several hops each, two tenants, tight tier budgets. The full
run (three families, minutes) is ``python -m bench.load``; its numbers are in RELIABILITY.md."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bench.load import LoadConfig, run_load
from bench.load_server import conversation_reader
from gateway.settings import AuthSettings, StoreSettings
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, Gateway
from tests.reliability.conftest import OTHER_KEY

pytestmark = pytest.mark.models


def test_bounded_load_keeps_every_conversation_its_own_and_tiers_within_budget(serve: Callable[..., Gateway]) -> None:
    budgets = StoreSettings(cpu_budget_bytes=48 << 20, ssd_budget_bytes=256 << 20)  # a few turns: demotions happen
    gw = serve(auth=AuthSettings(client_keys=[CLIENT_KEY, OTHER_KEY], admin_key=ADMIN_KEY), store=budgets)  # type: ignore[list-item]
    cfg = LoadConfig(gw.url, (CLIENT_KEY, OTHER_KEY), ("executor", "reviewer", "summarizer"), conversations=3,
                     hops=3, duration_s=20, context_chars=600, max_tokens=4)  # fmt: skip
    report = asyncio.run(run_load(cfg, conversation_reader(gw.services)))
    summary = report.summary()
    assert report.requests >= 6 and not report.errors, summary
    assert len(report.conversations) >= 3 and report.own_history == len(report.conversations), summary
    assert not report.lost and not report.crossed
    assert {"native", "transfer"} <= set(report.ttft_ms), summary  # the reviewer takes the executor's turn
    assert summary["within_budget"] and {"cpu", "ssd"} <= set(report.peak_bytes), summary
    assert report.peak_bytes["cpu"] > 0
