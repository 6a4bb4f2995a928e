"""Security: the admin API refuses missing, wrong and client keys on every route; one tenant's KV
never serves another, even for the same text and the same conversation id; keys appear in no log,
event, metric, error message or file the gateway writes; dashboard forms carry CSRF tokens."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from engines.local import LocalEngine
from gateway.settings import AuthSettings
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, SMOL, Gateway
from tests.gateway.helpers import saved_identity
from tests.reliability.conftest import OTHER_KEY, answer, assert_openai_error, chat, events, native, opening, then

pytestmark = pytest.mark.models
WRONG_KEY = "sk-test-wrong-key-0123456789"


def admin_routes(gw: Gateway) -> list[tuple[str, str]]:
    """Every admin operation the OpenAPI schema lists, with its path parameters filled in."""
    paths = httpx.get(f"{gw.url}/openapi.json").json()["paths"]
    return [
        (method.upper(), path.replace("{adapter_id}", "1").replace("{job_id}", "abc"))
        for path, operations in paths.items() if path.startswith("/admin") for method in operations
    ]  # fmt: skip


def test_every_admin_route_refuses_missing_wrong_and_client_keys(gateway: Gateway) -> None:
    routes = admin_routes(gateway)
    assert len(routes) >= 10
    for method, path in routes:
        for headers, status, code in (
            ({}, 401, "invalid_api_key"),
            ({"Authorization": f"Bearer {WRONG_KEY}"}, 401, "invalid_api_key"),
            ({"Authorization": f"Basic {ADMIN_KEY}"}, 401, "invalid_api_key"),  # the admin key, wrong scheme
            ({"Authorization": f"Bearer {CLIENT_KEY}"}, 403, "admin_key_required"),
        ):
            r = httpx.request(method, f"{gateway.url}{path}", headers=headers, json={"sender": "a", "receiver": "b"})
            assert_openai_error(r, status, code)
    with gateway.http(ADMIN_KEY) as admin:  # nothing happened: no version, no fit job, no audit entry
        assert admin.get("/admin/adapters").json() == [] and admin.get("/admin/audit").json() == []
    assert gateway.services.jobs.jobs == {}


def test_tenant_a_kv_never_serves_tenant_b_even_for_the_same_text_and_conversation(
    serve: Callable[..., Gateway],
) -> None:
    gw = serve(auth=AuthSettings(client_keys=[CLIENT_KEY, OTHER_KEY], admin_key=ADMIN_KEY))  # type: ignore[list-item]
    first = opening(90)
    reply = answer(chat(gw, "executor", first, "shared-id", key=CLIENT_KEY))[0]
    gw.settle()
    second = then(first, reply, "Name one function it mentions.")
    a_values = {e["handle"] for e in events(gw, "kv.stored")}
    hits = len(events(gw, "kv.hit"))
    # The reviewer first (B's conversation has no turn yet, so A's turn is all a transfer could
    # take), then the executor (A's cached prefix is all a lookup could find).
    for role in ("reviewer", "executor"):
        text, hf, cached = answer(chat(gw, role, second, "shared-id", key=OTHER_KEY))
        assert hf["path"] == "native" and cached == 0 and hf["tokens_transferred"] == 0, hf
        assert text == native(gw, role, second)
        gw.settle()
    b_hits = {e["handle"] for e in events(gw, "kv.hit")[hits:]}  # B's own turns may be read, never A's
    assert a_values and not b_hits & a_values
    _, hf, cached = answer(chat(gw, "executor", second, "shared-id", key=CLIENT_KEY))
    assert hf["path"] == "prefix" and cached > 0  # A's own value is still there for A


def test_keys_are_never_logged_stored_or_echoed(
    serve: Callable[..., Gateway], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gw = serve(auth=AuthSettings(client_keys=[CLIENT_KEY, OTHER_KEY], admin_key=ADMIN_KEY))  # type: ignore[list-item]
    texts: list[str] = []
    for key in (CLIENT_KEY, OTHER_KEY, WRONG_KEY, ADMIN_KEY):
        r = chat(gw, "executor", [{"role": "user", "content": "Hello"}], "conv-keys", key=key)
        texts.append(r.text)
        for path in ("/admin/adapters", "/admin/fits/nope", "/v1/models"):
            texts.append(httpx.get(f"{gw.url}{path}", headers={"Authorization": f"Bearer {key}"}).text)
    gw.settle()
    texts.append(httpx.get(f"{gw.url}/metrics").text)
    texts.append(httpx.get(f"{gw.url}/health/ready").text)
    texts += [str(e) for e in gw.services.store.events.read(count=10_000)]
    client = gw.services.store.client
    for redis_key in client.scan_iter(count=1000):  # test-only: every key and value in Redis
        texts.append(redis_key.decode(errors="replace"))
        if client.type(redis_key) == b"hash":
            texts += [str(v) for v in client.hgetall(redis_key).values()]
    texts.append(caplog.text)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name.startswith("registry.db") for p in files)
    for key in (CLIENT_KEY, OTHER_KEY, WRONG_KEY, ADMIN_KEY):
        secret = re.escape(key.removeprefix("sk-"))
        assert not any(re.search(secret, t) for t in texts), f"{key} appears in a response, log, event or Redis"
        for p in files:  # SQLite, Redis's append-only log, SSD payloads
            assert key.encode() not in p.read_bytes(), f"{key} appears in {p}"


def posting_forms(page: str) -> list[str]:
    forms = re.findall(r"<form\b.*?</form>", page, re.S | re.I)
    return [f for f in forms if re.search(r'method="post"', f, re.I)]


def attribute(form: str, pattern: str) -> str:
    match = re.search(pattern, form)
    assert match is not None, form
    return match.group(1)


def test_every_dashboard_form_that_posts_carries_the_session_csrf_token(
    gateway: Gateway, load_engine: Callable[[str], LocalEngine], tmp_path: Path
) -> None:
    folder = saved_identity(load_engine(SMOL), tmp_path / "identity")
    files = {part: (folder / name).read_bytes() for part, name in (("manifest", "manifest.json"),
                                                                   ("weights", "adapter.safetensors"))}  # fmt: skip
    with gateway.http(ADMIN_KEY) as admin:
        adapter_id = admin.post("/admin/adapters", files=files).json()["id"]
    with httpx.Client(base_url=gateway.url, timeout=60) as browser:
        assert browser.post("/dashboard/login", data={"key": ADMIN_KEY}).status_code == 303
        pages = ["", "/adapters", "/live", "/upload", "/fits/new"]
        pages += [f"/adapters/{adapter_id}/{action}" for action in ("shadow", "promote", "retire")]
        forms: list[str] = []
        for page in pages:
            r = browser.get(f"/dashboard{page}")
            assert r.status_code == 200, page
            forms += posting_forms(r.text)
        actions = {attribute(f, r'action="([^"]+)"') for f in forms}
        assert len(forms) >= 4 and any("/promote" in a for a in actions), actions
        tokens = {attribute(f, r'name="csrf" value="([0-9a-f]+)"') for f in forms if "/login" not in f}
        assert len(tokens) == 1  # the session's one token, in every form
        huge = f"/dashboard/adapters/{10**24}/promote"  # was a 500 from SQLite's integer overflow
        assert browser.get(huge).status_code in (400, 404)
        assert browser.post(huge, data={"csrf": tokens.pop()}).status_code in (400, 404)
        for action in actions - {"/dashboard/login"}:
            for token in ("", "0" * 64):  # missing or wrong: refused, nothing changes
                assert browser.post(action, data={"csrf": token, "confirm": "yes"}).status_code in (400, 403), action
    with gateway.http(ADMIN_KEY) as admin:
        assert admin.get("/admin/adapters").json()[0]["status"] == "candidate"
