"""Bad input gets a clear 4xx in the OpenAI error shape, never a 500: schemathesis over the
OpenAPI schema, then the cases the issue names one by one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engines.local import LocalEngine
from gateway.engine_pool import EnginePool
from gateway.settings import GenerationDefaults, RoleSettings
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, GEMMA, SMOL, Gateway
from tests.gateway.helpers import saved_identity
from tests.reliability.conftest import assert_openai_error

pytestmark = pytest.mark.models
EXAMPLES = 60  # per operation; the whole run takes about a minute here
NOT_FUZZED = {("POST", "/admin/fits")}  # a valid body starts a minutes-long fit (tests/gateway/test_admin.py)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def small(start_gateway: Callable[..., Gateway], pool: EnginePool) -> Gateway:
    """Engines that take at most 256 prompt tokens and 4 new ones: each fuzzed chat that passes
    validation costs a fraction of a second."""
    tight = {name: replace(p, settings=p.settings.model_copy(update={"max_prompt_tokens": 256, "max_tokens": 4}))
             for name, p in ((SMOL, pool[SMOL]), (GEMMA, pool[GEMMA]))}  # fmt: skip
    two = GenerationDefaults(max_tokens=2)
    roles = {"executor": RoleSettings(engine=SMOL, generation=two),
             "summarizer": RoleSettings(engine=GEMMA, generation=two)}  # fmt: skip
    return start_gateway(engines=EnginePool(tight), roles=roles)


def fuzz(operation: Any, url: str, key: str) -> None:
    """Up to EXAMPLES generated requests for one operation; raises on the first failed check."""

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])  # fmt: skip
    @given(case=operation.as_strategy())
    def exercise(case: Any) -> None:
        response = case.call(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        case.validate_response(response, checks=CHECKS)

    exercise()


def test_schemathesis_finds_no_server_error_and_every_response_conforms(small: Gateway) -> None:
    schema = schemathesis.openapi.from_url(f"{small.url}/openapi.json")
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in NOT_FUZZED:
            continue
        operations += 1
        key = ADMIN_KEY if operation.path.startswith("/admin") else CLIENT_KEY
        try:
            fuzz(operation, small.url, key)
        except Exception as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}"[:3000])
    assert operations >= 15
    assert not failures, "\n\n".join(failures)


def post(gw: Gateway, body: Any, path: str = "/v1/agents/executor", **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    hs = {"Authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json", **headers}
    return httpx.post(f"{gw.url}{path}", content=content, headers=hs, timeout=60)


HELLO = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),  # unknown message role
        ({"messages": [{"role": "user"}]}, "messages.0.content"),  # no content
        ({"messages": [{"content": "hi"}]}, "messages.0.role"),  # no role
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages.0.content"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"messages": HELLO, "temperature": -1}, "temperature"),
        ({"messages": HELLO, "n": 2}, "n"),
        ({"messages": HELLO, "conversation_id": ""}, "conversation_id"),  # bad conversation ids
        ({"messages": HELLO, "conversation_id": "x" * 201}, "conversation_id"),
        ({"messages": HELLO, "conversation_id": "a\nb"}, "conversation_id"),  # would break the response header
        ({"messages": HELLO, "conversation_id": "a b"}, "conversation_id"),
        ({"messages": HELLO, "conversation_id": "會話"}, "conversation_id"),
        ({"messages": HELLO, "conversation_id": 42}, "conversation_id"),
    ],
)
def test_malformed_requests_get_a_400_naming_the_field(small: Gateway, body: dict[str, Any], param: str) -> None:
    r = post(small, body)
    assert_openai_error(r, 400, "invalid_request")
    assert r.json()["error"]["param"] == param


def test_bad_bodies_headers_roles_and_sizes_get_clear_4xx(small: Gateway) -> None:
    assert_openai_error(post(small, b"{not json"), 400, "invalid_request")
    assert_openai_error(post(small, b"\xff\xfe"), 400, "invalid_request")
    for bad in ("a\tb", "x" * 201, "會話"):
        hs = {"Authorization": f"Bearer {CLIENT_KEY}".encode(), "X-Conversation-Id": bad.encode()}
        r = httpx.post(f"{small.url}/v1/agents/executor", json={"messages": HELLO}, headers=hs, timeout=60)
        assert_openai_error(r, 400, "invalid_request")
    assert_openai_error(post(small, {"messages": HELLO}, path="/v1/agents/nobody"), 404, "model_not_found")
    assert_openai_error(post(small, {"messages": HELLO, "model": "../admin"}, path="/v1/chat/completions"), 404,
                        "model_not_found")  # fmt: skip
    assert_openai_error(post(small, {"messages": HELLO, "max_tokens": 5}), 400, "max_tokens_too_large")
    long = [{"role": "user", "content": "word " * 300}]  # over the engine's 256 prompt tokens
    assert_openai_error(post(small, {"messages": long}), 400, "context_length_exceeded")
    many = [{"role": "user", "content": "hi"}] * 257  # over limits.max_messages
    assert_openai_error(post(small, {"messages": many}), 400, None)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 32768
        yield b'"}]}'

    r = httpx.post(f"{small.url}/v1/agents/executor", content=chunks(), timeout=60,
                   headers={"Authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"})  # fmt: skip
    assert_openai_error(r, 413, "request_too_large")
    ok = post(small, {"messages": HELLO, "conversation_id": "tenant-7/conv:42_a.b"})
    assert ok.status_code == 200 and ok.headers["x-conversation-id"] == "tenant-7/conv:42_a.b"


def test_upload_with_traversal_in_names_and_version_stays_inside_the_adapters_folder(
    small: Gateway, load_engine: Callable[[str], LocalEngine], tmp_path: Path
) -> None:
    folder = saved_identity(load_engine(SMOL), tmp_path / "identity")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["sender"]["name"] = "../../../../../tmp/hf-evil-sender"
    manifest["receiver"]["name"] = "/etc/hf-evil-receiver"
    files = {"manifest": ("../../m.json", json.dumps(manifest).encode()),
             "weights": ("../../w.safetensors", (folder / "adapter.safetensors").read_bytes())}  # fmt: skip
    with small.http(ADMIN_KEY) as admin:
        r = admin.post("/admin/adapters", files=files, data={"version": "../../../../tmp/hf-evil-version"})
    assert r.status_code == 201, r.text
    root = small.services.settings.adapters_dir.resolve()
    stored = Path(r.json()["artifact_path"]).resolve()
    assert stored.is_relative_to(root) and stored.parent.parent == root
    assert sorted(p.name for p in stored.iterdir()) == ["adapter.safetensors", "manifest.json"]
    for outside in ("/tmp/hf-evil-sender", "/etc/hf-evil-receiver", "/tmp/hf-evil-version"):
        assert not Path(outside).exists()
    assert [p for p in (root / ".uploads").iterdir()] == []  # no staging left behind
