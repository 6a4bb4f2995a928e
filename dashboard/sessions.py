"""Admin sign-in for the dashboard: a signed session cookie and a CSRF token per session.

Signing in checks the gateway's admin key once; the browser then holds an HttpOnly cookie
``<issued>.<nonce>.<hmac>``. The HMAC key is derived from the admin key, so changing the admin key
signs everyone out, and nothing secret is stored. Every form that changes state carries the
session's CSRF token, ``HMAC(key, "csrf:" + nonce)``, checked on POST. Without an admin key the
dashboard's admin actions are off, as the admin API is.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "hf_dashboard"


@dataclass(frozen=True)
class Session:
    nonce: str
    issued: int


class Sessions:
    def __init__(self, admin_key: str | None, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be positive")
        self._key = hmac.new(admin_key.encode(), b"dashboard", hashlib.sha256).digest() if admin_key else None
        self.ttl_s = ttl_s
        self.clock = clock

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def _sign(self, message: str) -> str:
        if self._key is None:
            raise RuntimeError("sessions are off: no admin key")
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A new session's cookie value (call only after checking the admin key)."""
        body = f"{int(self.clock())}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign('session:' + body)}"

    def verify(self, cookie: str | None) -> Session | None:
        """The session a cookie value names, or None if it is missing, forged or expired."""
        if not cookie or self._key is None:
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        issued, nonce, sig = parts
        if not hmac.compare_digest(sig, self._sign(f"session:{issued}.{nonce}")):
            return None
        if not 0 <= self.clock() - int(issued) <= self.ttl_s:
            return None
        return Session(nonce, int(issued))

    def csrf(self, session: Session) -> str:
        return self._sign("csrf:" + session.nonce)

    def check_csrf(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf(session))
