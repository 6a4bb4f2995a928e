"""Every error's answer: status, OpenAI error shape and headers, for the gateway's own errors and for
those of the lower layers (by the most specific mapped class)."""

from __future__ import annotations

import json

import pytest

from engines.errors import BadPrompt, EngineBusy, KVMismatch, PromptTooLong, UnknownModel
from engines.sglang import SGLangError
from gateway.errors import FOREIGN, EngineTimeout, GatewayError, InvalidRequest, PayloadTooLarge, to_response
from heterofold.errors import FingerprintMismatch, KVFormatError
from store.errors import PayloadMissing, StoreUnavailable


def answer(exc: Exception) -> tuple[int, dict[str, object], str | None]:
    r = to_response(exc)
    return r.status_code, json.loads(bytes(r.body))["error"], r.headers.get("retry-after")


@pytest.mark.parametrize(
    ("exc", "status", "error", "retry_after"),
    [
        (EngineBusy("full"), 429, {"message": "full", "type": "rate_limit_error", "param": None,
                                   "code": "engine_busy"}, "1"),
        (PromptTooLong("long"), 400, {"message": "long", "type": "invalid_request_error", "param": "messages",
                                      "code": "context_length_exceeded"}, None),
        (BadPrompt("bad"), 400, {"message": "bad", "type": "invalid_request_error", "param": None,
                                 "code": "invalid_prompt"}, None),
        (UnknownModel("who"), 404, {"message": "who", "type": "invalid_request_error", "param": None,
                                    "code": "model_not_found"}, None),
        (FingerprintMismatch("fp"), 400, {"message": "fp", "type": "invalid_request_error", "param": None,
                                          "code": "invalid_adapter"}, None),
        (PayloadMissing("gone"), 503, {"message": "store unavailable: gone", "type": "server_error", "param": None,
                                       "code": "store_unavailable"}, None),
        (StoreUnavailable("down"), 503, {"message": "store unavailable: down", "type": "server_error",
                                         "param": None, "code": "store_unavailable"}, None),
        (KVMismatch("kv"), 500, {"message": "engine error: kv", "type": "server_error", "param": None,
                                 "code": "engine_error"}, None),
        (SGLangError("http"), 500, {"message": "engine error: http", "type": "server_error", "param": None,
                                    "code": "engine_error"}, None),
    ],
)  # fmt: skip
def test_lower_layer_errors_answer_by_their_most_specific_mapped_class(
    exc: Exception, status: int, error: dict[str, object], retry_after: str | None
) -> None:
    assert answer(exc) == (status, error, retry_after)


def test_gateway_errors_answer_with_their_class_attributes() -> None:
    assert answer(EngineTimeout("slow")) == (
        504, {"message": "slow", "type": "server_error", "param": None, "code": "engine_timeout"}, None,
    )  # fmt: skip
    assert answer(PayloadTooLarge("big")) == (
        413, {"message": "big", "type": "invalid_request_error", "param": None, "code": "request_too_large"}, None,
    )  # fmt: skip
    assert answer(InvalidRequest("n", param="n", code="bad_n")) == (
        400, {"message": "n", "type": "invalid_request_error", "param": "n", "code": "bad_n"}, None,
    )  # fmt: skip


def test_anything_else_is_a_500_without_internals() -> None:
    assert answer(KVFormatError("secret")) == (
        500, {"message": "internal error", "type": "server_error", "param": None, "code": "internal_error"}, None,
    )  # fmt: skip
    assert answer(RuntimeError("secret"))[1]["message"] == "internal error"


def test_no_gateway_error_is_mapped_from_outside() -> None:
    assert not any(issubclass(cls, GatewayError) for cls in FOREIGN)
