"""Admin actions on the dashboard need an admin session and the session's CSRF token; anything
less is a clear 403, and bad input a clear 4xx. Over real HTTP, without a browser."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import httpx
import pytest

from dashboard.sessions import COOKIE
from tests.dashboard.traffic import statuses
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, GEMMA, SMOL, Gateway

pytestmark = pytest.mark.models


@pytest.fixture
def signed_in(gateway: Gateway) -> Iterator[tuple[httpx.Client, str]]:
    """A client holding an admin session, and the session's CSRF token (read from a form)."""
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        yield _sign_in(client)


def _sign_in(client: httpx.Client) -> tuple[httpx.Client, str]:
    r = client.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard/adapters"})
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/adapters"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    page = client.get("/dashboard/upload")
    assert page.status_code == 200
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match is not None
    return client, match.group(1)


def test_actions_without_a_session_are_refused(gateway: Gateway, versions: dict[str, int]) -> None:
    with httpx.Client(base_url=gateway.url) as anonymous:
        v2 = versions["v2"]
        for method, path in (("POST", f"/dashboard/adapters/{v2}/promote"), ("GET", "/dashboard/upload"),
                             ("GET", f"/dashboard/adapters/{v2}/retire"), ("GET", "/dashboard/fits/new")):  # fmt: skip
            r = anonymous.request(method, path, data={"csrf": "x"} if method == "POST" else None)
            assert r.status_code == 403, path
            assert "Sign in with the admin key" in r.text
        anonymous.cookies.set(COOKIE, "1700000000.abcd." + "0" * 64, path="/dashboard")  # forged
        r = anonymous.post(f"/dashboard/adapters/{versions['v2']}/promote", data={"csrf": "x"})
        assert r.status_code == 403
    assert statuses(gateway)["v2"] == "candidate"


def test_wrong_keys_do_not_sign_in(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url) as client:
        for key in ("wrong", CLIENT_KEY):  # a client key is not the admin key
            r = client.post("/dashboard/login", data={"key": key})
            assert r.status_code == 403 and "That is not the admin key." in r.text
            assert COOKIE not in client.cookies


def test_a_missing_or_wrong_csrf_token_is_refused(
    gateway: Gateway, versions: dict[str, int], signed_in: tuple[httpx.Client, str]
) -> None:
    client, _ = signed_in
    path = f"/dashboard/adapters/{versions['v2']}/shadow"
    assert client.post(path, data={"csrf": "0" * 64}).status_code == 403
    r = client.post(path, data={})
    assert r.status_code == 400  # the form field is required
    assert statuses(gateway)["v2"] == "candidate"
    r = client.post("/dashboard/logout", data={"csrf": "wrong"})
    assert r.status_code == 403 and "CSRF" in r.text


def test_bad_input_gets_a_clear_4xx(versions: dict[str, int], signed_in: tuple[httpx.Client, str]) -> None:
    client, csrf = signed_in
    r = client.post(f"/dashboard/adapters/{versions['v2']}/explode", data={"csrf": csrf})
    assert r.status_code == 404 and "no adapter action" in r.text
    r = client.post("/dashboard/adapters/99999/promote", data={"csrf": csrf})
    assert r.status_code == 404 and "no adapter version 99999" in r.text
    assert client.post(f"/dashboard/adapters/{10**30}/promote", data={"csrf": csrf}).status_code == 400
    r = client.get("/dashboard/fits/confirm", params={"sender": SMOL, "receiver": SMOL})
    assert r.status_code == 400 and "different engines" in r.text
    r = client.get("/dashboard/fits/confirm", params={"sender": SMOL, "receiver": "nope"})
    assert r.status_code == 400 and "no engine 'nope'" in html.unescape(r.text)
    r = client.get("/dashboard/fits/confirm", params={"sender": SMOL, "receiver": GEMMA, "docs": 1})
    assert r.status_code == 400
    files = {"manifest": b"{}", "weights": b"not safetensors"}
    r = client.post("/dashboard/upload", data={"csrf": csrf, "confirm": "yes"}, files=files)
    assert r.status_code == 400 and "not a valid adapter artifact" in r.text
    r = client.post("/dashboard/upload", data={"csrf": csrf}, files=files)
    assert r.status_code == 400 and "confirmation" in r.text
    assert client.get("/dashboard/events", params={"after": "not-an-id"}).status_code == 400
    assert client.get("/dashboard/fits/nope").status_code == 404
    r = client.post(f"/dashboard/adapters/{versions['v2']}/rollback", data={"csrf": csrf})
    assert r.status_code == 409 and "only the active version" in r.text
