"""Errors of the gateway, and the one handler that maps every error to the OpenAI error shape.

GatewayError
├── AuthError              no or a wrong bearer key (401)
│   └── Forbidden              a client key on the admin API (403)
├── UnknownRole            a role (model) the config does not name (404)
├── NotFound               an adapter version or job that does not exist (404)
├── Conflict               a state change the current state does not allow (409)
├── InvalidRequest         a request the schema accepts but the limits do not (400)
│   └── PayloadTooLarge        a body over ``limits.max_body_bytes`` (413)
├── RegistryError          the SQL registry failed (503)
├── EngineFailed           the engine raised while answering (503)
└── EngineTimeout          the engine sent nothing for ``engines.<name>.timeout_s`` (504)

Errors of the lower layers map too: ``EngineBusy`` to 429 with Retry-After, ``PromptTooLong`` and
``BadPrompt`` to 400, ``StoreError`` to 503 (only where no native fallback exists), anything else to
500 without internals in the message.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.errors import BadPrompt, EngineBusy, EngineError, PromptTooLong, UnknownModel
from heterofold.errors import AdapterError
from store.errors import StoreError

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class AuthError(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(AuthError):
    status, type, code = 403, "permission_error", "admin_key_required"


class UnknownRole(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class NotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class Conflict(GatewayError):
    status, type, code = 409, "invalid_request_error", "conflict"


class InvalidRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class PayloadTooLarge(InvalidRequest):
    status, code = 413, "request_too_large"


class RegistryError(GatewayError):
    status, type, code = 503, "server_error", "registry_unavailable"


class EngineFailed(GatewayError):
    status, type, code = 503, "server_error", "engine_failed"


class EngineTimeout(GatewayError):
    status, type, code = 504, "server_error", "engine_timeout"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The OpenAI error shape, documented in the OpenAPI schema for every error status."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (400, "Invalid request"), (401, "Missing or unknown key"), (403, "Admin key required"), (404, "Not found"),
        (409, "Conflict"), (413, "Body too large"), (429, "Engine busy (Retry-After)"), (500, "Internal error"),
        (503, "Registry, store or engine unavailable"), (504, "Engine timeout"),
    )
}  # fmt: skip


def error_body(message: str, type_: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def to_response(exc: Exception) -> JSONResponse:
    """The HTTP answer for any exception, in the OpenAI error shape."""
    if isinstance(exc, GatewayError):
        return _json(exc.status, error_body(str(exc), exc.type, param=exc.param, code=exc.code))
    if isinstance(exc, EngineBusy):
        body = error_body(str(exc), "rate_limit_error", code="engine_busy")
        return _json(429, body, {"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, PromptTooLong):
        return _json(
            400, error_body(str(exc), "invalid_request_error", param="messages", code="context_length_exceeded")
        )
    if isinstance(exc, BadPrompt):
        return _json(400, error_body(str(exc), "invalid_request_error", code="invalid_prompt"))
    if isinstance(exc, UnknownModel):
        return _json(404, error_body(str(exc), "invalid_request_error", code="model_not_found"))
    if isinstance(exc, AdapterError):
        return _json(400, error_body(str(exc), "invalid_request_error", code="invalid_adapter"))
    if isinstance(exc, StoreError):
        return _json(503, error_body(f"store unavailable: {exc}", "server_error", code="store_unavailable"))
    if isinstance(exc, EngineError):
        return _json(500, error_body(f"engine error: {exc}", "server_error", code="engine_error"))
    log.exception("unhandled error", exc_info=exc)
    return _json(500, error_body("internal error", "server_error", code="internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return to_response(exc)

    async def handle_validation(_: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg", "invalid request"))
        return _json(400, error_body(message, "invalid_request_error", param=param, code="invalid_request"))

    async def handle_http(_: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        detail = exc.detail if isinstance(exc, StarletteHTTPException) else "error"
        code = "request_too_large" if status == 413 else str(status)
        return _json(status, error_body(str(detail), "invalid_request_error", code=code))

    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    for exc_type in (GatewayError, EngineError, AdapterError, StoreError, Exception):
        app.add_exception_handler(exc_type, handle)
