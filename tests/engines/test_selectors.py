"""Selectors on real zoo models: the attention read-out is the model's own attention, the sections
function finds what a gateway conversation shares, and each selector answers through one interface."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest
import torch

from engines import selectors
from engines.lexicon import LexiconUnavailable
from engines.selectors import (
    SELECTORS,
    Evidence,
    HopText,
    SelectorUnavailable,
    auto_path,
    candidates,
    lexical_confidence,
    make_selector,
    names_its_sentence,
    select,
)
from gateway.hop import asked, quoted_last, quoted_messages
from harness.evaluate import eval_hop
from heterofold.align import Section, shared_sections
from heterofold.corpus import stdlib_text
from heterofold.select import GATE, QUOTE_SEPARATOR, answer_recall
from heterofold.suite import builtin_suite
from heterofold.suite_kinds import CONTINUE_QUESTION, SUMMARY_QUESTION

pytestmark = pytest.mark.models
SMOL, GEMMA, QWEN = "smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize(("name", "cached"), [(SMOL, 80), (GEMMA, 80), (SMOL, 0)])
def test_attention_read_out_is_the_models_eager_attention(load_engine: Any, name: str, cached: int) -> None:
    """Over a cache (the attention selectors' pass) and over a whole prompt run from scratch (the
    scout's): the last 4 rows the probe records are the eager model's."""
    engine = load_engine(name)
    ids = list(engine.encode(stdlib_text(600, start=3)).ids)[:90]
    past = run(engine.prefill(ids[:cached]))[0] if cached else None
    got = run(engine.attention(ids, past=past, rows=4))  # (layers, 4, 90): the last 90 - cached ids run
    model = engine.model
    before = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.config._attn_implementation = before
    want = torch.stack([out.attentions[layer][0].float().mean(0)[-4:] for layer in engine.attention_layers()])
    assert engine.attention_layers() and all(engine.spec.windows[i] == 0 for i in engine.attention_layers())
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:2]), atol=1e-4, rtol=0)


def test_sections_of_a_gateway_conversation(load_engine: Any) -> None:
    """System prompts differ, several turns, a new message: what the two prompts share, in order."""
    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    doc, notes = stdlib_text(700, start=8), stdlib_text(300, start=40)
    reply = "The module sorts lists.\n\nIt also takes a key function for custom orders."
    turn = [{"role": "system", "content": "You are the reader."}, {"role": "user", "content": f"{doc}\n\nRead this."},
            {"role": "assistant", "content": reply}, {"role": "user", "content": notes}]  # fmt: skip
    s_text = sender.render(turn)
    hop = [{"role": "system", "content": "You are the critic."}, *turn[1:], {"role": "assistant", "content": "Noted."},
           {"role": "user", "content": "What does the key do?"}]  # fmt: skip
    r_text = receiver.render(hop)
    sections = shared_sections(s_text, r_text, [m["content"] for m in hop])
    pieces = [r_text[s.receiver_start : s.receiver_start + s.length] for s in sections]
    for s, piece in zip(sections, pieces, strict=True):
        assert s_text[s.sender_start : s.sender_start + s.length] == piece
    assert pieces[0] == doc.strip().split("\n\n")[0] and "It also takes a key function for custom orders." in pieces
    assert notes.strip().split("\n\n")[-1] in pieces
    assert not any("critic" in p or "reader" in p or "What does the key do?" in p or p == "Read this." for p in pieces)
    assert [s.receiver_start for s in sections] == sorted(s.receiver_start for s in sections)


def test_every_selector_chooses_through_one_interface(load_engine: Any) -> None:
    sender, receiver, scout = load_engine(SMOL), load_engine(GEMMA), load_engine(QWEN)
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("paraphrase",)) if "-d50-" in i.id)
    hop: HopText = run(eval_hop(sender, receiver, item))
    prefix = hop.transferable_prefix()
    # the receiver's native KV of the prefix stands in for a fitted map (receiver-attention)
    mapped, _ = run(receiver.prefill(list(hop.receiver_ids[:prefix])))
    ev = Evidence(hop, candidates(hop, prefix), sender, receiver, mapped, scout)
    at = hop.receiver_text.index(item.context)
    recalled = {}
    for name in SELECTORS:
        sel = run(select(make_selector(name), ev, 0.02))
        assert sel.positions == sorted(set(sel.positions)) and set(sel.positions) <= set(ev.candidates)
        assert len(sel.positions) == -(-len(ev.candidates) * 2 // 100)  # ceil(2% of the candidates)
        spans = [(hop.receiver_offsets[j][0] - at, hop.receiver_offsets[j][1] - at) for j in sel.positions]
        recalled[name] = answer_recall(item.context, item.answer, spans)[1]
    # the paraphrased question shares no word with its sentence: BM25 cannot find it, the scout
    # (qwen2.5 reading the text) does (BENCHMARKS.md measures both on many items)
    assert not recalled["lexical"] and recalled["scout"]
    # the meaning selector reads the same question by word vectors, no model run ("safe" ~ "strongbox")
    assert recalled["meaning"] and recalled["lexical-hop|meaning"]
    # a union leaves out the part the hop cannot run (no embedded sender: lexical alone)
    blind = replace(ev, sender=None)
    lexical = run(select(make_selector("lexical"), blind, 0.02)).positions
    assert run(select(make_selector("sender-attention+lexical"), blind, 0.02)).positions == lexical
    with pytest.raises(SelectorUnavailable):
        run(select(make_selector("sender-attention+scout"), replace(blind, scout=None), 0.02))
    # a gated union also leaves out what it cannot run, and keeps lexical's own choice
    assert run(select(make_selector("lexical/sender-attention"), blind, 0.02)).positions == lexical
    # the paraphrase leaves lexical unsure (no rare question word covered): the gated union lets
    # the sender's attention lead, as the plain union that names it first
    gated = run(select(make_selector("lexical/sender-attention"), ev, 0.02)).positions
    assert gated == run(select(make_selector("sender-attention+lexical"), ev, 0.02)).positions
    # the fallback: lexical unsure on the paraphrase, so the sender's reading leads, then lexical-hop's
    fallback = run(select(make_selector("lexical-hop|sender-attention"), ev, 0.02)).positions
    assert fallback == run(select(make_selector("sender-attention+lexical-hop"), ev, 0.02)).positions
    for bad in ("lexical+bogus", "lexical/bogus", "lexical/lexical", "lexical/scout+sender-attention", "lexical|bogus"):
        with pytest.raises(ValueError, match="unknown selector"):
            make_selector(bad)


def test_a_confident_fallback_never_reads_with_the_sender(load_engine: Any) -> None:
    """``lexical-hop|sender-attention`` on a look-up whose question repeats its needle's words:
    lexical alone chooses, and the sender's attention pass never runs (a look-up costs what
    lexical costs)."""
    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("passkey",)) if "-d50-" in i.id)
    hop: HopText = run(eval_hop(sender, receiver, item))
    prefix = hop.transferable_prefix()

    class NoReading:
        encode = sender.encode

        def attention(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the sender read, though lexical was sure")

    ev = Evidence(hop, candidates(hop, prefix), NoReading(), receiver, None, None)  # type: ignore[arg-type]
    chosen = run(select(make_selector("lexical-hop|sender-attention"), ev, 0.02)).positions
    assert chosen == run(select(make_selector("lexical-hop"), ev, 0.02)).positions
    with pytest.raises(AssertionError, match="the sender read"):  # the same hop, unsure: it reads
        run(select(make_selector("lexical-hop|sender-attention"), replace(ev, hop=replace(hop, question="Say it.")),
                   0.02))  # fmt: skip


def test_quote_paths_rewrite_only_the_shared_text() -> None:
    """The gateway's quote rewrite on a rendered conversation (a stand-in engine renders plainly)."""
    doc = "First paragraph about sorting lists in place.\n\nSecond paragraph: the pass key is 48213."

    class Plain:
        def render(self, messages: list[dict[str, str]]) -> str:
            return "".join(f"<{m['role']}> {m['content']} </{m['role']}> " for m in messages)

    messages = [{"role": "system", "content": "You are the critic, shared with nobody."},
                {"role": "user", "content": doc}, {"role": "user", "content": "What is the pass key?"}]  # fmt: skip
    text = Plain().render(messages)
    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    second = text.index("Second")
    sections = shared_sections(text, text, [doc])
    end = text.index("</user>", second)
    chosen = [j for j, (a, b) in enumerate(offsets) if a >= second and b <= end]

    class HopStandIn:
        pass

    hop: Any = HopStandIn()
    hop.text, hop.offsets, hop.messages = text, offsets, messages
    out = quoted_messages(hop, sections, chosen)
    assert out[0] == messages[0] and out[2] == messages[2]  # system prompt and new message whole
    assert out[1]["content"] == "Second paragraph: the pass key is 48213."
    last, head = quoted_last(hop, sections, chosen)  # the new message shares nothing: the quote at its head
    assert last["content"].endswith("What is the pass key?") and "48213" in last["content"] and head == ""
    assert quoted_messages(hop, sections, [])[1]["content"] == QUOTE_SEPARATOR.strip()

    # the document pasted into the new message itself: the quote goes after it, before the question
    pasted = [messages[0], {"role": "user", "content": f"{doc}\n\nWhat is the pass key?"}]
    hop.text = Plain().render(pasted)
    hop.offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", hop.text)]
    hop.messages = pasted
    second = hop.text.index("Second")
    chosen = [j for j, (a, b) in enumerate(hop.offsets) if a >= second and b <= hop.text.index("48213.") + 6]
    last, head = quoted_last(hop, shared_sections(hop.text, hop.text, [pasted[1]["content"]]), chosen)
    assert head == doc
    quote, question = last["content"].removeprefix(doc).split("\n\n")[1:]
    assert last["content"].startswith(doc) and "48213" in quote and question == "What is the pass key?"
    # the quote path cuts the pasted document down to the chosen spans, and keeps the question
    pasted_sections = [Section(0, hop.text.index(doc), len(doc))]
    cut = quoted_messages(hop, pasted_sections, chosen)
    assert cut[0] == pasted[0] and cut[1]["content"].endswith("What is the pass key?")
    assert "48213" in cut[1]["content"] and "First" not in cut[1]["content"]
    # what the selectors read as the question: the new message outside the shared document
    hop.question = pasted[1]["content"]
    at = hop.text.index(doc)
    assert asked(hop, [Section(0, at, len(doc))]) == "What is the pass key?"
    pieces = [Section(0, at, 10), Section(20, at + 20, len(doc) - 20)]  # a line between them unshared
    assert asked(hop, pieces) == "What is the pass key?"
    assert asked(hop, [Section(0, at, len(hop.question))]) == hop.question  # all of it shared: all of it
    assert asked(hop, []) == hop.question


def test_bench_selectors_reports_recall_time_and_quote_accuracy_per_selector(load_engine: Any) -> None:
    """``heterofold bench selectors`` on two items: every selector it can run gets a recall per
    budget that agrees with ``answer_recall``, a read time, and a quote accuracy only where asked."""
    from bench.selectors import across, compare, markdown

    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    items = [i for i in builtin_suite(lengths=(512,), kinds=("passkey",)) if i.id.endswith(("-d10-0", "-d90-0"))]
    result = run(compare(sender, receiver, items, adapter=None, scout=None, budgets=(0.02, 0.05),
                         quote_selectors=["lexical"], native=False))  # fmt: skip
    assert result["items"] == 2 and set(result["summary"]) == {
        "lexical",
        "lexical-hop",
        "sender-attention",
        "sender-attention+lexical",
        "lexical/sender-attention",
        "lexical-hop/sender-attention",
        "lexical|sender-attention",
        "lexical-hop|sender-attention",
        "meaning",
        "meaning+lexical",
        "meaning+sender-attention",
        "lexical-hop|meaning",
        "lexical-hop|meaning|sender-attention",
    }
    lexical = result["summary"]["lexical"]["all"]
    assert lexical["n"] == 2 and lexical["sentence@0.05"] == 1.0  # the question repeats the needle's words
    assert "quote_accuracy" in lexical and "quote_accuracy" not in result["summary"]["sender-attention"]["all"]
    for row in result["per_item"]:
        for per in row["selectors"].values():
            assert per["read_ms"] >= 0 and per["0.05"]["ms"] >= per["read_ms"]
            assert per["0.02"]["sentence"] <= per["0.05"]["sentence"]  # a larger budget keeps the smaller's choice
    # a selector's time includes its ranking: the meaning selector's work is all ranking
    assert all(row["selectors"]["meaning"]["read_ms"] > 0 for row in result["per_item"])
    assert result["summary"]["meaning"]["all"]["ms@0.02"] >= result["summary"]["meaning"]["all"]["read_ms"]
    assert "| lexical |" in markdown(result) and "| sender-attention+lexical |" in across([result, result])


def test_meaning_fallback_without_its_table_is_lexical_hop(load_engine: Any, zoo: Any, tmp_path: Any) -> None:
    """An SGLang gateway whose zoo lacks gemma3's table: ``lexical-hop|meaning`` leaves the
    meaning part out (``SelectorUnavailable``) and chooses what lexical-hop chooses."""
    from engines.lexicon import use_zoo
    from engines.zoo import Zoo

    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("paraphrase",)) if "-d50-" in i.id)
    hop: HopText = run(eval_hop(sender, receiver, item))
    prefix = hop.transferable_prefix()
    ev = Evidence(hop, candidates(hop, prefix))
    plain = run(select(make_selector("lexical-hop"), ev, 0.02)).positions
    assert run(select(make_selector("lexical-hop|meaning"), ev, 0.02)).positions != plain  # unsure: meaning leads
    use_zoo(Zoo(tmp_path))
    try:
        assert run(select(make_selector("lexical-hop|meaning"), ev, 0.02)).positions == plain
        with pytest.raises(SelectorUnavailable, match="heterofold models pull gemma3-270m"):
            run(select(make_selector("meaning"), ev, 0.02))
    finally:
        use_zoo(zoo)


def test_candidates_hold_tokens_with_no_sender_token(load_engine: Any) -> None:
    """Into qwen2.5 a sentence's final "." sits in ".\\n\\n", a token no smollm2 token lines up
    with: it is a candidate, so the selector's sentence is whole (``answer_recall``) and quoted with
    its stop, while the map leaves it to recompute as before."""
    sender, receiver = load_engine(SMOL), load_engine(QWEN)
    items = builtin_suite(lengths=(1024,), kinds=("facts",))[:5]
    whole = 0
    for item in items:
        hop: HopText = run(eval_hop(sender, receiver, item))
        prefix = hop.transferable_prefix()
        src = hop.source(prefix).tolist()
        cands = candidates(hop, prefix)
        assert any(src[j] < 0 for j in cands)
        sel = run(select(make_selector("lexical-hop"), Evidence(hop, cands), 0.02))
        at = hop.receiver_text.index(item.context)
        spans = [(hop.receiver_offsets[j][0] - at, hop.receiver_offsets[j][1] - at) for j in sel.positions]
        whole += answer_recall(item.context, item.answer, spans)[1]
    assert whole == len(items)


def test_auto_quotes_a_look_up_and_maps_the_rest(load_engine: Any) -> None:
    """``names_its_sentence`` (the ``auto`` path's rule) on one context: a look-up that repeats its
    needle's words is named (coverage 1.0), a paraphrase, a summary and a continuation are not, and
    the rule reads lexical's confidence in the hop's window only."""
    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("multikey",)) if "-d50-" in i.id)
    hop: HopText = run(eval_hop(sender, receiver, item))
    ev = Evidence(hop, candidates(hop, hop.transferable_prefix()))
    assert lexical_confidence(ev) == pytest.approx(1.0) and names_its_sentence(ev)
    for question in ("Summarize the document in three sentences.", "Continue the text from where it stops."):
        other = replace(ev, hop=replace(hop, question=question))
        assert lexical_confidence(other) < GATE and not names_its_sentence(other)
    named = []
    for para in builtin_suite(lengths=(1024,), kinds=("paraphrase",)):
        p_hop: HopText = run(eval_hop(sender, receiver, para))
        named.append(names_its_sentence(Evidence(p_hop, candidates(p_hop, p_hop.transferable_prefix()))))
    assert named == [False] * 5  # no paraphrase shares its rare words with the sentence that answers it
    assert lexical_confidence(replace(ev, candidates=[])) == 0.0


def test_auto_path_quotes_details_and_recomputes_the_rest_in_place(load_engine: Any, monkeypatch: Any) -> None:
    """``auto_path``: a look-up that names its sentence and a paraphrased one (a detail in other
    words, ``engines.request_kind``) are quoted; "summarize" and "continue" name no sentence and
    ask for no detail: the map with the spans recomputed in place. Without the classifier's word
    table, the rule before it: every hop that names no sentence maps and quotes."""
    load_engine(GEMMA)  # the word table's model, converted on a fresh machine
    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    item = next(i for i in builtin_suite(lengths=(1024,), kinds=("multikey",)) if "-d50-" in i.id)
    hop: HopText = run(eval_hop(sender, receiver, item))
    ev = Evidence(hop, candidates(hop, hop.transferable_prefix()))
    assert auto_path(ev) == "quote"
    para = builtin_suite(lengths=(1024,), kinds=("paraphrase",))[0]
    p_hop: HopText = run(eval_hop(sender, receiver, para))
    p_ev = Evidence(p_hop, candidates(p_hop, p_hop.transferable_prefix()))
    assert not names_its_sentence(p_ev) and auto_path(p_ev) == "quote"
    whole = [replace(ev, hop=replace(hop, question=q)) for q in (SUMMARY_QUESTION, CONTINUE_QUESTION)]
    assert [auto_path(w) for w in whole] == ["transfer", "transfer"]

    def unavailable() -> None:
        raise LexiconUnavailable("no table")

    monkeypatch.setattr(selectors, "request_kind", unavailable)
    assert [auto_path(w) for w in (ev, p_ev, *whole)] == ["quote", "map_quote", "map_quote", "map_quote"]
