"""Errors of the gateway, and the one handler that maps every error to the OpenAI error shape.

GatewayError               each class carries its answer: ``status``, OpenAI ``type`` and ``code``
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

Errors of the lower layers answer as ``FOREIGN`` maps them, by the most specific class in the
exception's MRO: ``EngineBusy`` 429 with Retry-After, ``PromptTooLong`` and ``BadPrompt`` 400,
``UnknownModel`` 404, ``AdapterError`` 400, ``StoreError`` 503 (only where no native fallback exists),
any other ``EngineError`` 500; anything else 500 without internals in the message.

Signals inside the gateway, plain Exceptions that never reach the API:
- ``SenderKVMissing``, ``StorageMiss``: a hop falls back (``gateway/hop.py``), the class is the reason;
- ``FitCancelled``: a fit gives up: its job was cancelled (from any replica), or the gateway is
  stopping (``gateway/jobs.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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


class SenderKVMissing(Exception):
    """The conversation's latest turn names a KV value the store no longer holds."""


class StorageMiss(Exception):
    """An engine that imports KV through HiCache storage (SGLang) loaded none of it and prefilled."""


class FitCancelled(Exception):
    """A running fit gives up at its next progress step: its job was cancelled, or the gateway is stopping."""


@dataclass(frozen=True)
class Answer:
    """How an error of another package answers: ``prefix`` goes before its message."""

    status: int
    type: str
    code: str
    param: str | None = None
    prefix: str = ""
    retry_after_s: int | None = None


FOREIGN: dict[type[Exception], Answer] = {
    EngineBusy: Answer(429, "rate_limit_error", "engine_busy", retry_after_s=RETRY_AFTER_S),
    PromptTooLong: Answer(400, "invalid_request_error", "context_length_exceeded", param="messages"),
    BadPrompt: Answer(400, "invalid_request_error", "invalid_prompt"),
    UnknownModel: Answer(404, "invalid_request_error", "model_not_found"),
    AdapterError: Answer(400, "invalid_request_error", "invalid_adapter"),
    StoreError: Answer(503, "server_error", "store_unavailable", prefix="store unavailable: "),
    EngineError: Answer(500, "server_error", "engine_error", prefix="engine error: "),
}


def foreign_answer(exc: Exception) -> Answer | None:
    """The answer of the most specific class in ``exc``'s MRO that ``FOREIGN`` maps."""
    return next((FOREIGN[cls] for cls in type(exc).__mro__ if cls in FOREIGN), None)


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
    answer = foreign_answer(exc)
    if answer is not None:
        headers = None if answer.retry_after_s is None else {"Retry-After": str(answer.retry_after_s)}
        body = error_body(f"{answer.prefix}{exc}", answer.type, param=answer.param, code=answer.code)
        return _json(answer.status, body, headers)
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
    handled: tuple[type[Exception], ...] = (GatewayError, *FOREIGN, Exception)
    for exc_type in handled:
        app.add_exception_handler(exc_type, handle)
