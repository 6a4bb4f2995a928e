"""The OpenAI-shaped API through the official ``openai`` client against a real server."""

from __future__ import annotations

from dataclasses import replace

import openai
import pytest

from engines.loader import LoadedModel
from engines.local import LocalEngine
from gateway.engine_pool import EnginePool
from tests.gateway.conftest import ADMIN_KEY, GEMMA, SMOL, Gateway

pytestmark = pytest.mark.models


def test_openai_client_gets_a_chat_completion_with_heterofold_usage(gateway: Gateway) -> None:
    client = gateway.agent("executor")
    raw = client.chat.completions.with_raw_response.create(
        model="executor", messages=[{"role": "user", "content": "Say hello."}], max_tokens=4
    )
    reply = raw.parse()
    assert raw.headers["x-request-id"]
    assert reply.object == "chat.completion" and reply.model == "executor"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 4
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    hf = (usage.model_extra or {})["heterofold"]
    assert hf["path"] == "native" and hf["ttft_ms"] > 0 and hf["tokens_transferred"] == 0


def test_streaming_yields_chunks_then_usage_then_done(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(
        model="executor", messages=[{"role": "user", "content": "Count: one, two,"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    with gateway.http(None) as http:
        body = {"model": "executor", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
        r = http.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-test-client"})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.rstrip().endswith("data: [DONE]") and '"usage"' not in r.text


def test_models_lists_the_roles_and_unknown_roles_are_404(gateway: Gateway) -> None:
    client = gateway.client()
    assert {m.id for m in client.models.list()} == {"executor", "reviewer", "summarizer"}
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"


def test_keys_guard_the_api_but_not_the_probes(gateway: Gateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        gateway.client(key="sk-wrong").models.list()
    with gateway.http(None) as anonymous:
        assert anonymous.get("/health/live").status_code == 200
        ready = anonymous.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["checks"]["redis"] == "ok"
        assert anonymous.get("/metrics").status_code == 200
        assert anonymous.get("/admin/adapters").status_code == 401
    with gateway.http("sk-test-client") as client_key:
        r = client_key.get("/admin/adapters")
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    with gateway.http(ADMIN_KEY) as admin:
        assert admin.get("/admin/adapters").json() == []


def test_limits_answer_in_the_openai_error_shape(gateway: Gateway) -> None:
    client = gateway.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="executor", messages=[{"role": "user", "content": "hi"}], max_tokens=65)
    assert err.value.code == "max_tokens_too_large"
    long = "word " * 2100
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="executor", messages=[{"role": "user", "content": long}])
    assert err.value.code == "context_length_exceeded"
    with gateway.http("sk-test-client") as http:
        r = http.post("/v1/chat/completions", content=b"{" + b" " * (2 << 20) + b"}",
                      headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = http.post("/v1/chat/completions", json={"model": "executor", "messages": []})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_full_engine_queue_answers_429_with_retry_after(start_gateway, pool: EnginePool) -> None:  # type: ignore[no-untyped-def]
    smol = pool[SMOL].engine
    assert isinstance(smol, LocalEngine)
    one_at_a_time = LocalEngine(LoadedModel(smol.model, smol.tokenizer, smol.spec, 0.0), capacity=1)
    gateway = start_gateway(engines=EnginePool({SMOL: replace(pool[SMOL], engine=one_at_a_time), GEMMA: pool[GEMMA]}))
    body = {"model": "executor", "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 64,
            "stream": True}  # fmt: skip
    with gateway.http("sk-test-client") as busy, busy.stream("POST", "/v1/chat/completions", json=body) as first:
        next(first.iter_lines())  # the first request is running
        with pytest.raises(openai.RateLimitError) as err:
            gateway.client().chat.completions.create(model="executor", messages=body["messages"], max_tokens=2)
        assert err.value.code == "engine_busy" and err.value.response.headers["retry-after"] == "1"
