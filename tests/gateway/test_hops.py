"""The hop decision on real models: same-model prefix reuse, identity transfer between roles on one
model, cross-family transfer through the active adapter (map + recompute, and the map with the
chosen spans quoted), and native when nothing serves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import ShadowSettings
from tests.gateway.conftest import SMOL, Gateway, make_settings
from tests.gateway.helpers import CONTEXT, ask, upload

pytestmark = pytest.mark.models


def test_next_turn_of_a_role_reuses_its_cached_prefix(gateway: Gateway) -> None:
    first = [{"role": "user", "content": f"{CONTEXT}\n\nWhat is this about?"}]
    reply, hf, cached = ask(gateway, "executor", first, "conv-prefix")
    assert hf["path"] == "native" and cached == 0
    gateway.settle()
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Shorter, please."}]
    _, hf, cached = ask(gateway, "executor", second, "conv-prefix")
    assert hf["path"] == "prefix" and cached > 300 and cached % 16 == 0
    assert hf["prefill_ms_saved"] > 0 and hf["tokens_transferred"] == 0


def test_hop_between_roles_on_one_model_transfers_through_the_identity_adapter(gateway: Gateway) -> None:
    _, hf, _ = ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], "conv-identity")
    assert hf["path"] == "native"
    gateway.settle()
    review = [{"role": "user", "content": f"{CONTEXT}\n\nIs anything missing?"}]
    _, hf, cached = ask(gateway, "reviewer", review, "conv-identity")
    assert hf["path"] == "transfer" and hf["adapter_version"] == "identity"
    assert hf["tokens_transferred"] > 300 and cached >= hf["tokens_transferred"]
    assert 0 < hf["tokens_recomputed"] < cached and hf["transfer_ms"] > 0


def test_cross_family_hop_transfers_through_the_active_adapter(gateway: Gateway, fitted_adapter: Path) -> None:
    upload(gateway, fitted_adapter)
    ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], "conv-cross")
    gateway.settle()
    _, hf, cached = ask(gateway, "summarizer", [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}], "conv-cross")
    assert hf["path"] == "transfer" and hf["adapter_version"] == "test-v1"
    assert hf["tokens_transferred"] > 300 and cached > hf["tokens_transferred"] // 2
    with gateway.http(None) as http:
        metrics = http.get("/metrics").text
    assert 'heterofold_transfer_seconds_count{route="smollm2-135m-instruct -> gemma3-270m"} 1.0' in metrics
    assert 'heterofold_requests_total{path="transfer",role="summarizer"} 1.0' in metrics


def test_hop_without_an_adapter_for_the_pair_prefills_natively(gateway: Gateway) -> None:
    ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], "conv-none")
    gateway.settle()
    _, hf, cached = ask(gateway, "summarizer", [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}], "conv-none")
    assert hf["path"] == "native" and cached == 0 and hf["fallback"] is None


def test_map_quote_hop_imports_the_mapped_context_and_quotes_the_chosen_spans(
    start_gateway: Callable[..., Gateway], fitted_adapter: Path
) -> None:
    """Four gemma3 roles on the same hop: ``critic`` on ``transfer`` (map + recompute of the chosen
    tokens), ``quoter`` on ``map_quote`` (the map, and the chosen spans as text), ``briefer`` like
    it with another selector for hops from smollm2, and ``summarizer`` on the default path across
    families, ``auto``, which takes ``transfer`` for "Summarize." (no sentence named, no detail
    asked) and ``quote`` (no KV) for a look-up that names its sentence."""
    roles = make_settings(Path("unused")).roles
    summarizer = roles["summarizer"]
    assert summarizer.policy.path == "transfer"  # the suite's explicit choice
    roles["critic"] = summarizer
    roles["summarizer"] = summarizer.model_copy(update={"policy": summarizer.policy.model_copy(update={"path": None})})
    quoting = summarizer.policy.model_copy(update={"path": "map_quote"})
    roles["quoter"] = summarizer.model_copy(update={"policy": quoting})
    by_sender = quoting.model_copy(update={"sender_selectors": {SMOL: "lexical"}})
    roles["briefer"] = summarizer.model_copy(update={"policy": by_sender})
    gateway = start_gateway(roles=roles, shadow=ShadowSettings(sample_rate=1.0, shadow_rate=0.0))
    upload(gateway, fitted_adapter)
    question = [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}]

    def hop(role: str, conversation: str) -> tuple[Any, int, int]:
        if conversation != "alone":
            ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], conversation)
            gateway.settle()
        reply = gateway.agent(role).chat.completions.create(
            model=role,
            messages=question,  # type: ignore[arg-type]
            extra_headers={"X-Conversation-Id": conversation},
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        details = reply.usage.prompt_tokens_details
        return (reply.usage.model_extra or {})["heterofold"], reply.usage.prompt_tokens, details.cached_tokens or 0

    alone, native_tokens, _ = hop("summarizer", "alone")  # no earlier turn: native, the request's own prompt
    assert alone["path"] == "native"
    transferred, transfer_tokens, _ = hop("critic", "conv-transfer")
    hf, prompt_tokens, cached = hop("quoter", "conv-map-quote")
    assert transferred["path"] == "transfer" and transfer_tokens == native_tokens
    assert hf["path"] == "map_quote" and hf["adapter_version"] == "test-v1" and hf["fallback"] is None
    assert alone["selector"] is None and transferred["selector"] == hf["selector"] == "lexical-hop|meaning"
    assert hf["tokens_transferred"] > 300 and cached >= hf["tokens_transferred"]
    # the chosen tokens (recompute_budget 10% of the context) are quoted, not recomputed ...
    chosen = transferred["tokens_recomputed"] - hf["tokens_recomputed"]
    assert 0.05 * cached < chosen < 0.2 * cached
    # ... as text at the head of the question, after the context
    assert native_tokens + 0.5 * chosen < prompt_tokens < native_tokens + 3 * chosen
    briefed, _, _ = hop("briefer", "conv-by-sender")
    assert briefed["path"] == "map_quote" and briefed["selector"] == "lexical"
    summed, summed_tokens, _ = hop("summarizer", "conv-auto")  # auto: the spans recomputed in place
    assert summed["path"] == "transfer" and summed_tokens == native_tokens
    assert summed["tokens_recomputed"] == transferred["tokens_recomputed"] and summed["adapter_version"] == "test-v1"
    question = [{"role": "user", "content": f"{CONTEXT}\n\nWhich externally maintained library is it derived from?"}]
    looked_up, quoted_tokens, cached = hop("summarizer", "conv-look-up")  # lexical is sure: quote, no KV
    assert looked_up["path"] == "quote" and looked_up["adapter_version"] is None and cached == 0
    assert looked_up["tokens_transferred"] == 0 and quoted_tokens < native_tokens / 2
    gateway.settle()  # the hops' shadow runs: each re-runs natively the prompt its engine ran
    with gateway.http(None) as http:
        metrics = http.get("/metrics").text
    assert 'heterofold_shadow_samples_total{version="test-v1"} 4.0' in metrics
    assert 'heterofold_requests_total{path="quote",role="summarizer"} 1.0' in metrics
