"""Bearer keys: client keys for the chat API, one admin key for mutations. Keys are kept only as
sha256 digests and compared in constant time. A client's tenant (the salt that scopes its KV in the
store) is derived from its key, so two clients never share cached values."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from gateway.errors import AuthError, Forbidden


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class KeyRing:
    def __init__(self, client_keys: Iterable[str], admin_key: str | None) -> None:
        self._clients = {digest(k) for k in client_keys if k}
        self._admin = digest(admin_key) if admin_key else None

    @property
    def open(self) -> bool:
        """No client keys configured: the chat API takes any caller (one shared tenant)."""
        return not self._clients

    def _is_admin(self, d: str) -> bool:
        return self._admin is not None and hmac.compare_digest(d, self._admin)

    def client(self, authorization: str | None) -> str:
        """The caller's tenant; raises AuthError for a missing or unknown key."""
        token = _bearer(authorization)
        if token is None:
            if self.open:
                return ""
            raise AuthError("missing bearer key: send Authorization: Bearer <key>")
        d = digest(token)
        if self._is_admin(d) or any(hmac.compare_digest(d, c) for c in self._clients):
            return d[:16]
        if self.open:
            return ""
        raise AuthError("unknown API key")

    def admin(self, authorization: str | None) -> None:
        token = _bearer(authorization)
        if token is None:
            raise AuthError("missing bearer key: the admin API needs the admin key")
        d = digest(token)
        if self._is_admin(d):
            return
        if any(hmac.compare_digest(d, c) for c in self._clients):
            raise Forbidden("this key is a client key; the admin API needs the admin key")
        raise AuthError("unknown API key")
