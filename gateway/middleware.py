"""ASGI middleware (plain ASGI, no per-request task overhead): the ``x-request-id`` header, and the
body size limit on the chat API."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import error_body


class RequestId:
    """Echo the caller's ``x-request-id`` or make one; it goes on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = rid[:128] if rid.isprintable() and rid else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", rid.encode("latin-1")))
            await send(message)

        await self.app(scope, receive, send_with_id)


class _TooLarge(HTTPException):
    """Raised while the body is read: FastAPI passes HTTPExceptions through to the handler."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


class BodyLimit:
    """Refuse bodies over ``limit`` bytes on paths under ``prefix`` with 413, whether or not the
    client sent Content-Length."""

    def __init__(self, app: ASGIApp, *, limit: int, prefix: str = "/v1") -> None:
        self.app = app
        self.limit = limit
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Send) -> None:
        body: Any = error_body(f"request body over {self.limit} bytes", "invalid_request_error",
                               code="request_too_large")  # fmt: skip
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": data})
