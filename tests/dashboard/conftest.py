"""Dashboard fixtures: a real gateway over loopback HTTP (the session's CPU engines, embedded Redis,
SQLite), two small smollm2 -> gemma3 adapter versions registered through the admin API, and a
real headless Chromium (Debian's ``/usr/bin/chromium``) driven by Playwright. Screenshots of every
page go to ``artifacts/screenshots/`` (or ``$HETEROFOLD_SCREENSHOTS``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from gateway.app import create_app
from gateway.engine_pool import EnginePool
from gateway.settings import DashboardSettings, ShadowSettings, StoreSettings
from tests.dashboard.traffic import register
from tests.gateway import conftest as gateway_fixtures
from tests.gateway.conftest import GEMMA, SMOL, Gateway, _serve, make_settings
from tests.gateway.helpers import small_adapter

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("HETEROFOLD_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))
FAST = DashboardSettings(sample_interval_s=0.5, poll_s=0.2, stream_s=20.0)
pool = gateway_fixtures.pool  # the session's smollm2 and gemma3 engines, shared with tests/gateway


@pytest.fixture(scope="module")
def artifacts(pool: EnginePool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for seed, version in enumerate(("v1", "v2"), start=1):
        folder = tmp_path_factory.mktemp(f"adapter-{version}")
        small_adapter(pool[SMOL].engine, pool[GEMMA].engine, version, seed).save(folder)  # type: ignore[arg-type]
        out[version] = folder
    return out


def serve(data_dir: Path, pool: EnginePool, **overrides: Any) -> Iterator[Gateway]:
    settings = make_settings(data_dir, dashboard=FAST, **overrides)
    yield from _serve(create_app(settings, pool=pool, own_pool=False))


@pytest.fixture(scope="module")
def gateway(pool: EnginePool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Every transferred request through a registry adapter is shadow-evaluated (real drift samples)."""
    yield from serve(
        tmp_path_factory.mktemp("dashboard"), pool, shadow=ShadowSettings(sample_rate=1.0, shadow_rate=0.0)
    )


@pytest.fixture(scope="module")
def versions(gateway: Gateway, artifacts: dict[str, Path]) -> dict[str, int]:
    """v1 active and v2 a candidate, for smollm2 -> gemma3."""
    ids = {v: register(gateway, folder)["id"] for v, folder in artifacts.items()}
    with gateway.http() as admin:
        assert admin.post(f"/admin/adapters/{ids['v1']}/promote").status_code == 200
    return ids


@pytest.fixture
def tiny_store_gateway(pool: EnginePool, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway whose store tiers hold 1 MiB each: a turn's KV fits nowhere, so the store raises a
    real ``oom.alert`` (no_space) for every turn it is offered."""
    yield from serve(tmp_path, pool, store=StoreSettings(cpu_budget_bytes=1 << 20, ssd_budget_bytes=1 << 20))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module: while Playwright's sync API is open, its event loop counts as running in this
    thread, and any later test's ``asyncio.run`` would fail."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(30_000)
    yield p
    context.close()


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
