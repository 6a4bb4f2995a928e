"""Errors of the dashboard: one, answered as its error page (``dashboard/mount.py``)."""

from __future__ import annotations


class PageError(Exception):
    """Answered as the dashboard's error page with ``status`` (403 for a missing sign-in or a bad
    CSRF token, 404, 409, 400 ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
