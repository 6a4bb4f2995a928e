"""The dashboard in a real headless Chromium against a real gateway over HTTP: the overview after
chat requests, the live feed, the OOM banner, and promote and roll back through the UI. Every page
is saved as a screenshot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.conftest import screenshot
from tests.dashboard.traffic import CONTEXT, chat, statuses
from tests.gateway.conftest import ADMIN_KEY, GEMMA, SMOL, Gateway

pytestmark = pytest.mark.models
ROUTE = f"{SMOL} → {GEMMA}"


@pytest.fixture(scope="module")
def traffic(gateway: Gateway, versions: dict[str, int]) -> dict[str, dict[str, Any]]:
    """A pipeline of hops on one conversation, plus native baselines of the two receiving roles."""
    hops = {
        "executor": chat(gateway, "executor", CONTEXT, "pipeline"),
        "reviewer": chat(gateway, "reviewer", f"{CONTEXT}\n\nIs anything missing?", "pipeline"),
        "summarizer": chat(gateway, "summarizer", f"{CONTEXT}\n\nSummarize.", "pipeline"),
        "summarizer-native": chat(gateway, "summarizer", f"{CONTEXT}\n\nSummarize.", "baseline", reuse=False),
    }
    assert [h["path"] for h in hops.values()] == ["native", "transfer", "transfer", "native"]
    assert hops["summarizer"]["adapter_version"] == "v1"
    return hops


def route_row(page: Page, role: str, route: str) -> Any:
    return page.locator("#routes tbody tr", has=page.locator("td", has_text=route)).filter(
        has=page.locator(f"td:text-is('{role}')")
    )


def test_overview_shows_per_route_numbers_after_chat_requests(
    gateway: Gateway, versions: dict[str, int], traffic: dict[str, dict[str, Any]], page: Page
) -> None:
    page.goto(f"{gateway.url}/dashboard")
    expect(page.locator("#total-requests")).to_have_text(str(len(traffic)))
    row = route_row(page, "summarizer", ROUTE)
    expect(row).to_have_count(1)
    expect(row).to_contain_text("transfer 1")
    native, transfer = traffic["summarizer-native"]["ttft_ms"], traffic["summarizer"]["ttft_ms"]
    # the native median comes from the role (the baseline ran without a conversation's sender): marked "≈"
    expect(row.locator("td").nth(4)).to_have_text(f"≈ {native:.0f} ms")
    expect(row.locator("td").nth(5)).to_have_text(f"{transfer:.0f} ms")
    expect(row.locator("td.speedup")).to_have_text(f"{native / transfer:.2f}x")
    # the active version v1 was shadow-evaluated on the transfer: one sample, too few to alert
    expect(row.locator("td.drift-samples a")).to_have_text("1")
    expect(row.locator("td.drift-samples a")).to_have_attribute("href", f"/dashboard/adapters#adapter-{versions['v1']}")
    expect(row.locator("td.drift-kl")).to_have_text(re.compile(r"^\d[\d.e+-]*$"))
    expect(row.locator("td.drift-top1")).to_have_text(re.compile(r"^[01]\.\d\d$"))
    expect(row).not_to_have_class("drifted")
    saved = traffic["summarizer"]
    expect(row.locator("td").nth(10)).to_have_text(re.compile(r"^[\d,]+$"))
    assert int(row.locator("td").nth(10).inner_text().replace(",", "")) > saved["tokens_transferred"]
    reviewer = route_row(page, "reviewer", f"{SMOL} → {SMOL}")
    expect(reviewer).to_contain_text("transfer 1")
    # no native request for this role: native estimated as the transfer's TTFT plus the prefill it saved
    expect(reviewer.locator("td").nth(4)).to_have_text(re.compile(r"^est\. \d+ ms$"))
    expect(reviewer.locator("td.drift-samples")).to_have_text("-")  # same model: the identity, no registry version
    shown = float(reviewer.locator("td").nth(4).inner_text().split()[1])
    assert shown == pytest.approx(traffic["reviewer"]["ttft_ms"] + traffic["reviewer"]["prefill_ms_saved"], abs=1)
    expect(route_row(page, "executor", f"- → {SMOL}")).to_contain_text("native 1")
    speed = page.locator("svg.chart", has=page.locator("title", has_text="Speedup per route"))
    expect(speed.locator("rect.bar")).to_have_count(2)  # the two routes that transferred
    expect(page.locator("#tiers tbody tr", has_text="cpu")).to_contain_text("MiB")
    memory = page.locator("svg.chart", has=page.locator("title", has_text="Tier memory"))
    expect(memory.locator("polyline").first).to_be_attached()  # sampled over time
    screenshot(page, "overview")
    page.evaluate("window.notReloaded = true")
    chat(gateway, "summarizer", f"{CONTEXT}\n\nSummarize.", "baseline-2", reuse=False)
    # a request without reuse writes no event: the page's 5 s timer refreshes it in place
    expect(page.locator("#total-requests")).to_have_text(str(len(traffic) + 1), timeout=15_000)
    expect(route_row(page, "summarizer", f"- → {GEMMA}")).to_contain_text("native 2")
    assert page.evaluate("window.notReloaded") is True


def test_live_feed_shows_a_new_event_without_a_reload(
    gateway: Gateway, traffic: dict[str, dict[str, Any]], page: Page
) -> None:
    page.goto(f"{gateway.url}/dashboard/live")
    expect(page.locator("#feed-state")).to_have_text("live")
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#feed li.fresh")).to_have_count(0)
    hf = chat(gateway, "executor", f"{CONTEXT}\n\nWhich module is this from?", "pipeline")
    assert hf["path"] in ("prefix", "transfer")  # the conversation's context is reused
    fresh = page.locator("#feed li.fresh")
    expect(fresh.filter(has_text="prefix reuse").or_(fresh.filter(has_text="transfer")).first).to_be_visible()
    expect(fresh.filter(has_text="KV stored").first).to_be_visible()
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "live")


def test_oom_alert_shows_its_banner(tiny_store_gateway: Gateway, page: Page) -> None:
    page.goto(f"{tiny_store_gateway.url}/dashboard")
    expect(page.locator("#no-alerts")).to_be_visible()
    expect(page.locator("#oom-banner")).to_be_hidden()
    chat(tiny_store_gateway, "executor", CONTEXT, "oom")  # its turn's KV fits in no tier
    banner = page.locator("#oom-banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("no_space")
    screenshot(page, "overview-oom-alert")
    page.reload()  # rendered by the server too, with the alert in the active list
    expect(banner).to_be_visible()
    expect(page.locator("#alerts li.alert", has_text="OOM alert")).to_have_count(1)


def test_promote_and_roll_back_through_the_ui_change_the_active_version(
    gateway: Gateway,
    versions: dict[str, int],
    traffic: dict[str, dict[str, Any]],
    artifacts: dict[str, Path],
    page: Page,
) -> None:
    forbidden = page.goto(f"{gateway.url}/dashboard/adapters/{versions['v2']}/promote")
    assert forbidden is not None and forbidden.status == 403
    expect(page.locator("#error-message")).to_have_text("Sign in with the admin key to do this.")
    screenshot(page, "forbidden")
    page.goto(f"{gateway.url}/dashboard/adapters")
    expect(page.locator("a[data-action]")).to_have_count(0)  # signed out: no actions
    page.get_by_role("link", name="Sign in").first.click()
    expect(page).to_have_url(re.compile(r"/dashboard/login"))
    screenshot(page, "login")
    page.fill("input[name=key]", "not-the-key")
    with page.expect_response(lambda r: r.url.endswith("/dashboard/login") and r.request.method == "POST") as wrong:
        page.click("button[type=submit]")
    assert wrong.value.status == 403
    expect(page.locator("p.error")).to_have_text("That is not the admin key.")
    page.fill("input[name=key]", ADMIN_KEY)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/dashboard/adapters$"))

    pair = page.locator("section.pair", has_text=ROUTE)
    expect(pair.locator("tr[data-version=v1] .status")).to_have_text("active")
    expect(pair.locator("tr[data-version=v1]")).to_contain_text("1 samples")  # shadow-evaluated transfer
    expect(pair.locator("svg.chart circle")).to_have_count(1)
    screenshot(page, "adapters")

    pair.locator("tr[data-version=v2] a[data-action=promote]").click()
    expect(page.locator("h1")).to_have_text("Confirm: promote")
    screenshot(page, "confirm")
    assert statuses(gateway)["v2"] == "candidate"  # nothing happens before the confirmation
    page.click("#confirm")
    expect(page.locator("p.notice")).to_contain_text("promote: version v2")
    assert statuses(gateway) == {"v1": "candidate", "v2": "active"}

    pair.locator("tr[data-version=v2] a[data-action=rollback]").click()
    expect(page.locator("h1")).to_have_text("Confirm: roll back")
    page.click("#confirm")
    expect(page.locator("p.notice")).to_contain_text("rollback: version v1")
    assert statuses(gateway) == {"v1": "active", "v2": "candidate"}
    with gateway.http() as admin:
        audit = admin.get("/admin/audit").json()
    assert [(a["action"], a["actor"]) for a in audit[:2]] == [("promote", "dashboard"), ("rollback", "dashboard")]

    page.goto(f"{gateway.url}/dashboard/upload")
    screenshot(page, "upload")
    folder = artifacts["v1"]
    page.set_input_files("input[name=manifest]", str(folder / "manifest.json"))
    page.set_input_files("input[name=weights]", str(folder / "adapter.safetensors"))
    page.fill("input[name=version]", "v1-uploaded")
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("input[name=confirm]:invalid")).to_have_count(1)  # the box must be ticked first
    assert "v1-uploaded" not in statuses(gateway)
    page.check("input[name=confirm]")
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("p.notice")).to_contain_text("Registered version v1-uploaded")
    assert statuses(gateway)["v1-uploaded"] == "candidate"
    page.goto(f"{gateway.url}/dashboard/fits/new")
    screenshot(page, "fit-new")


def test_fit_through_the_ui_shows_live_progress_and_registers_a_candidate(
    gateway: Gateway, traffic: dict[str, dict[str, Any]], page: Page
) -> None:
    page.goto(f"{gateway.url}/dashboard/login?next=/dashboard/fits/new")
    page.fill("input[name=key]", ADMIN_KEY)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Fit a new adapter version")
    page.select_option("select[name=sender]", SMOL)
    page.select_option("select[name=receiver]", GEMMA)
    page.select_option("select[name=method]", "kv-ridge")
    page.fill("input[name=docs]", "2")
    page.fill("input[name=max_tokens]", "64")
    page.fill("input[name=version]", "ui-fit")
    page.get_by_role("button", name="Review…").click()
    expect(page.locator("h1")).to_have_text("Confirm: fit a new version")
    assert "ui-fit" not in statuses(gateway)
    page.click("#confirm")
    expect(page).to_have_url(re.compile(r"/dashboard/fits/[0-9a-f]{32}$"))
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#job-status")).to_have_text("done", timeout=240_000)  # polled by the page's script
    expect(page.locator("#job-percent")).to_have_text("100%")
    expect(page.locator("#job-result a")).to_contain_text("version id")
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "fit-job")
    assert statuses(gateway)["ui-fit"] == "candidate"
