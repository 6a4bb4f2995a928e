"""A cross-family hop into an engine that cannot recompute in place (SGLang, here the HTTP stand-in
of tests/sglang/standin.py backed by smollm2, not SGLang): the gateway's default path for such an
engine quotes the selected spans instead of importing a map that would answer like no context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.catalog import lookup
from engines.local import LocalEngine
from engines.zoo import Zoo
from gateway.app import create_app
from gateway.settings import EngineSettings, GenerationDefaults, RoleSettings, TransferPolicy
from heterofold.select import QUOTE_SEPARATOR
from heterofold.suite import builtin_suite
from heterofold.tasks import is_correct
from tests.gateway.conftest import SMOL, Gateway, _serve, make_settings
from tests.sglang.standin import StandIn, serve

pytestmark = pytest.mark.models


@pytest.fixture
def quoting_gateway(
    tmp_path: Path, zoo: Zoo, load_engine: Callable[[str], LocalEngine], redis_url: str
) -> Iterator[tuple[Gateway, StandIn]]:
    """Role ``writer`` on embedded smollm2, role ``reader`` on the SGLang stand-in, with no path set
    in the reader's policy: the engine kind picks it. The stand-in runs smollm2 too but is
    configured as another model (its own fingerprint), so the hop is a cross-model one with no
    adapter, which the quote path does not need."""
    local = load_engine(SMOL)
    standin = StandIn(local, redis_url, "smol-quote", pages=160)  # a whole 1K conversation backed up
    with serve(standin) as url:
        sglang = EngineSettings(kind="sglang", model=SMOL, url=url, model_dir=zoo.pull(lookup(SMOL)),
                                hicache_redis_url=redis_url, hicache_namespace=standin.namespace,
                                fingerprint=f"other-{local.spec.fingerprint}", max_prompt_tokens=2048,
                                max_tokens=24)  # fmt: skip
        policy = TransferPolicy(min_uncached_tokens=32, recompute_budget=0.05)
        short = GenerationDefaults(max_tokens=24)
        settings = make_settings(
            tmp_path,
            engines={SMOL: EngineSettings(model=SMOL, max_prompt_tokens=2048, max_tokens=24), "smol-sglang": sglang},
            roles={"writer": RoleSettings(engine=SMOL, generation=short, policy=policy),
                   "reader": RoleSettings(engine="smol-sglang", generation=short, policy=policy)},
            cache_dir=zoo.cache_dir,
        )  # fmt: skip
        gen = _serve(create_app(settings))
        try:
            yield next(gen), standin
        finally:
            next(gen, None)


def usage(reply: Any) -> dict[str, Any]:
    hf: dict[str, Any] = (reply.usage.model_extra or {})["heterofold"]
    return hf


def test_hop_into_sglang_quotes_the_selected_spans(quoting_gateway: tuple[Gateway, StandIn]) -> None:
    gateway, standin = quoting_gateway
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("passkey",)) if "-d50-" in i.id)
    head = {"X-Conversation-Id": "conv-quote"}
    first = gateway.agent("writer").chat.completions.create(
        model="writer", messages=[{"role": "user", "content": item.context}], extra_headers=head
    )
    assert usage(first)["path"] == "native"
    gateway.settle()
    messages = [
        {"role": "user", "content": item.context},
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": item.question},
    ]
    reply = gateway.agent("reader").chat.completions.create(model="reader", messages=messages,  # type: ignore[arg-type]
                                                            extra_headers=head)  # fmt: skip
    hf = usage(reply)
    assert hf["path"] == "quote" and hf["fallback"] is None and hf["tokens_transferred"] == 0
    served = standin.engine.decode(standin.requests[-1]["input_ids"])
    native = standin.engine.encode(standin.engine.render(messages)).ids
    assert reply.usage is not None and reply.usage.prompt_tokens == len(standin.requests[-1]["input_ids"])
    assert reply.usage.prompt_tokens < len(native) // 3  # the context was cut down to the chosen spans
    needle = f"The pass key is {item.answer}."
    # The engine read the needle sentence and the question, with the rest of the context left out
    # (whether smollm2-135m then answers is the model's business: BENCHMARKS.md measures that).
    assert needle in served and item.question in served and QUOTE_SEPARATOR.strip() in served


LOOKUPS = ("passkey", "multikey", "facts", "handoff")


def test_hop_into_sglang_answers_the_lookups_at_least_nine_tenths_as_often_as_native(
    quoting_gateway: tuple[Gateway, StandIn],
) -> None:
    """The SGLang-config hop (quote, the engine kind's default path) against the same engine reading
    the whole conversation natively, on the builtin look-up items at 1024 tokens (greedy, so the
    counts are the model's, not chance's)."""
    gateway, _ = quoting_gateway
    quoted = native = 0
    items = builtin_suite(lengths=(1024,), kinds=LOOKUPS)
    for n, item in enumerate(items):
        head = {"X-Conversation-Id": f"conv-lookup-{n}"}
        first = gateway.agent("writer").chat.completions.create(
            model="writer", messages=[{"role": "user", "content": item.context}], extra_headers=head
        )
        gateway.settle()
        messages: Any = [
            {"role": "user", "content": item.context},
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": item.question},
        ]
        hop = gateway.agent("reader").chat.completions.create(model="reader", messages=messages, extra_headers=head)
        alone = gateway.agent("reader").chat.completions.create(
            model="reader", messages=messages, extra_headers={"X-Conversation-Id": f"conv-alone-{n}"}
        )
        # alone: the whole prompt prefilled by the reader (from its own cached prefix where it has one)
        assert usage(hop)["path"] == "quote" and usage(alone)["path"] in ("native", "prefix")
        quoted += is_correct(item.answer, hop.choices[0].message.content or "")
        native += is_correct(item.answer, alone.choices[0].message.content or "")
    print(f"look-ups answered: quote {quoted}, native {native} of {len(items)}")
    assert native >= 4, "the receiver must answer some look-ups natively for the ratio to mean anything"
    assert quoted >= 0.9 * native
