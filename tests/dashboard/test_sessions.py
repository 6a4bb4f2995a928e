"""Admin sessions and CSRF tokens: signed, expiring, bound to the admin key."""

from __future__ import annotations

from dashboard.sessions import Sessions


def test_issued_session_verifies_and_its_csrf_token_checks() -> None:
    sessions = Sessions("sk-admin", ttl_s=60)
    session = sessions.verify(sessions.issue())
    assert session is not None
    assert sessions.check_csrf(session, sessions.csrf(session))
    assert not sessions.check_csrf(session, "0" * 64) and not sessions.check_csrf(session, None)


def test_forged_tampered_or_expired_cookies_are_refused() -> None:
    now = [1000.0]
    sessions = Sessions("sk-admin", ttl_s=60, clock=lambda: now[0])
    cookie = sessions.issue()
    issued, nonce, sig = cookie.split(".")
    assert sessions.verify(f"{issued}.{nonce}.{'0' * 64}") is None
    assert sessions.verify(f"{int(issued) + 1}.{nonce}.{sig}") is None
    assert sessions.verify("garbage") is None and sessions.verify(None) is None
    assert sessions.verify(Sessions("sk-other", ttl_s=60, clock=lambda: now[0]).issue()) is None
    now[0] += 61
    assert sessions.verify(cookie) is None


def test_csrf_token_of_one_session_does_not_pass_for_another() -> None:
    sessions = Sessions("sk-admin", ttl_s=60)
    a, b = sessions.verify(sessions.issue()), sessions.verify(sessions.issue())
    assert a is not None and b is not None
    assert not sessions.check_csrf(b, sessions.csrf(a))


def test_without_an_admin_key_sessions_are_off() -> None:
    sessions = Sessions(None, ttl_s=60)
    assert not sessions.enabled and sessions.verify("1.2.3") is None
