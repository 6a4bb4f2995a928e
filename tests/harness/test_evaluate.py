"""The evaluation harness's paths and ablations on a real zoo model: what each one sees, and the
identities that pin them down (an identity map is native; recomputing every token is native)."""

import asyncio

import pytest
import torch

from engines.selectors import LEXICAL, Evidence, candidates, select
from harness.evaluate import eval_hop, evaluate
from heterofold.adapter import Adapter, Manifest, Side
from heterofold.corpus import stdlib_text
from heterofold.select import elide
from heterofold.suite import builtin_suite
from heterofold.tasks import TaskItem

pytestmark = pytest.mark.models


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_quote_prompt_holds_the_selected_needle_and_the_question(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    item = builtin_suite(lengths=(512,), kinds=("passkey",))[2]
    hop = run(eval_hop(engine, engine, item))
    prefix = hop.transferable_prefix()
    ev = Evidence(hop, candidates(hop, prefix))
    picked = run(select(LEXICAL, ev, 0.05)).positions
    assert picked and all(hop.receiver_text.index(item.context) <= hop.receiver_offsets[j][0] for j in picked)
    quoted = elide(hop.receiver_text, [hop.receiver_offsets[j] for j in picked])
    assert item.answer in quoted and len(quoted) < len(item.context) / 4


def test_prefill_at_every_position_is_native_and_drops_the_rest(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("gemma3-270m")
    ids = list(engine.encode(stdlib_text(2000)).ids)[:200]
    dense = run(engine.score(ids))
    kv = run(engine.prefill_at(ids[:150], list(range(150))))
    torch.testing.assert_close(run(engine.score(ids, past=kv)), dense[150:], atol=1e-3, rtol=1e-3)
    # every other token absent, the kept ones at their true positions: the continuation differs
    kept = [*range(0, 150, 2), 149]
    sparse = run(engine.prefill_at([ids[j] for j in kept], kept))
    assert sparse.positions.tolist() == kept
    got = run(engine.score([ids[j] for j in kept] + ids[150:], past=sparse))
    assert got.shape == dense[150:].shape and float((got - dense[150:]).abs().max()) > 0.1


def test_evaluate_runs_every_path_and_the_identities_hold(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    items = builtin_suite(lengths=(256,), kinds=("passkey", "multikey"))[::5][:2]
    items.append(TaskItem("fid", stdlib_text(900, start=30), "Continue the text.", "", "continue", "fidelity"))
    identity = Adapter.identity(Side.of(engine.spec))
    result = run(
        evaluate(engine, engine, items, adapters={"heterofold": identity, "kv_ridge": identity}, budget=0.05,
                 budgets=(0.0, 0.05, 1.0), max_tokens=8, fidelity_tokens=12)
    )  # fmt: skip
    paths = result["paths"]
    expected = {"native", "no_context", "sender", "heterofold", "heterofold_map_only", "kv_ridge",
                "kv_ridge_recompute", "quote", "recompute_only", "heterofold+quote", "kv_ridge+quote",
                "heterofold+auto", "kv_ridge+auto"}  # fmt: skip
    assert set(paths) == expected
    families = {"heterofold", "kv_ridge", "quote", "recompute_only", "heterofold+quote", "kv_ridge+quote",
                "heterofold+auto", "kv_ridge+auto"}  # fmt: skip
    assert set(result["budget_frontier"]) == families
    assert set(result["budget_frontier"]["kv_ridge+quote"]) == {"0.05", "1"}  # no map-only quote
    assert set(result["heterofold_budget_frontier"]) == {"0", "0.05", "1"}
    assert paths["heterofold"]["budget"] == paths["kv_ridge_recompute"]["budget"] == 0.05
    for path in ("heterofold", "heterofold_map_only", "kv_ridge", "kv_ridge_recompute"):  # identity map = native
        assert paths[path]["accuracy"] == paths["native"]["accuracy"]
        assert paths[path]["first_token_kl"] < 1e-3 and paths[path]["top1_agreement"] == 1.0
        assert paths[path]["fidelity_kl"] < 1e-3 and paths[path]["fidelity_top1"] == 1.0
    every = result["budget_frontier"]["recompute_only"]["1"]  # every context token native: native itself
    assert every["first_token_kl"] < 1e-3 and every["fidelity_kl"] < 1e-3 and every["fidelity_top1"] == 1.0
    assert paths["no_context"]["fidelity_kl"] > 0.1  # the whole-context item needs its context
    adds = result["map_adds"]["heterofold"]["0.05"]
    assert adds["vs_recompute_only"]["all:accuracy"]["n"] == 2
    assert adds["vs_recompute_only"]["all:kl_reduction"]["n"] == 1
    assert result["per_item"]["quote@0.05"]["fid"]["correct"] is None
    # auto: the two look-ups name their sentence and are quoted, the continuation names none and asks
    # for no detail: the map with the spans recomputed in place; each scores what the path it took
    # scores (the same prompt and cache, run again)
    assert result["auto_via"]["kv_ridge+auto@0.05"] == {"quote": 2, "transfer": 1, "map_quote": 0}
    auto = result["per_item"]["kv_ridge+auto@0.05"]
    for item in items:
        via = auto[item.id]["via"]
        took = result["per_item"]["quote@0.05" if via == "quote" else "kv_ridge@0.05"][item.id]
        assert via == ("transfer" if item.id == "fid" else "quote") and auto[item.id]["named"] == (item.id != "fid")
        assert auto[item.id]["correct"] == took["correct"] and abs(auto[item.id]["first_kl"] - took["first_kl"]) < 1e-4
        if via == "transfer":
            assert abs(auto[item.id]["kl"] - took["kl"]) < 1e-4
    recall = result["selector"]["recall"]["0.05"]  # the fidelity item has no answer to recall
    assert result["selector"]["name"] == "lexical" and recall["all"]["n"] == 2
    # the passkey needle fits the budget whole; multikey's 14-token needle is cut to 12 tokens,
    # its matched words first, and loses its value's last digits
    assert recall["passkey"]["answer"] == recall["passkey"]["sentence"] == 1.0
    assert recall["multikey"]["answer"] == 0.0
    assert result["machine"]["map_dtype"] in ("float32", "bfloat16") and result["machine"]["threads"] >= 1


@pytest.mark.parametrize("gates", [False, True])
def test_distillation_steps_lower_the_answer_kl_of_a_noised_map(load_engine, gates: bool) -> None:  # type: ignore[no-untyped-def]
    from harness.distill_on_engines import build_docs, distill
    from heterofold.adapter import LayerMap

    engine = load_engine("smollm2-135m-instruct")
    side = Side.of(engine.spec)
    g = torch.Generator().manual_seed(0)
    identity = Adapter.identity(side)
    noised = Adapter(
        identity.manifest,
        [LayerMap(m.k_weight + 0.05 * torch.randn(m.k_weight.shape, generator=g), m.k_bias,
                  m.v_weight + 0.05 * torch.randn(m.v_weight.shape, generator=g), m.v_bias) for m in identity.maps],
    )  # fmt: skip
    (docs,) = run(build_docs(engine, engine, noised, [stdlib_text(700, start=11)], budgets=(0.0,), answer_tokens=8))
    # the same document to train and to measure: the steps must lower its loss
    clip = 1.0 if gates else None  # the gated run also clips each step's gradient norm
    out = run(distill(engine, noised, [docs, docs], method="distilled", version="t", fit_info={}, steps=6, lr=5e-3,
                      held=1, eval_every=3, gates=gates, clip=clip))  # fmt: skip
    m = out.manifest.metrics
    assert m["held_out_answer_kl_after_distill"] < 0.9 * m["held_out_answer_kl_before_distill"]
    assert m["distill_best_step"] in (3, 6) and out.manifest.method == "distilled"
    assert out.manifest.fit["gates"] is gates and out.manifest.fit["clip"] == clip


def test_a_documents_answer_and_target_are_the_receivers_own_from_scratch(load_engine) -> None:  # type: ignore[no-untyped-def]
    """The answer and its scores continue from the context's one dense prefill: they must equal a
    greedy answer and teacher-forced scores computed from scratch, past gemma3's sliding window."""
    from engines.base import SamplingParams
    from harness.distill_on_engines import build_docs

    engine = load_engine("gemma3-270m")
    side = Side.of(engine.spec)
    identity = Adapter.identity(side)
    full = engine.spec.windows.index(0)  # the map reads a full-attention sender layer: it holds every token
    adapter = Adapter(Manifest("identity", "t", side, side, tuple((full,) for _ in identity.maps)), identity.maps)
    ((doc,),) = run(build_docs(engine, engine, adapter, [stdlib_text(3000, start=5)], budgets=(0.0,), answer_tokens=8))
    assert len(doc.token_ids) > max(engine.spec.windows)  # the sliding layers drop part of the context
    n_answer = doc.answer_rows.stop - doc.answer_rows.start
    r_ids = doc.token_ids.tolist() + doc.suffix[: len(doc.suffix) - n_answer].tolist()
    fresh = run(engine.complete(r_ids, SamplingParams(max_tokens=8)))
    assert doc.suffix[len(doc.suffix) - n_answer :].tolist() == list(fresh.token_ids)
    scores = run(engine.score(r_ids + list(fresh.token_ids)))  # every position's logits, no past
    rows = scores[len(r_ids) - 1 : len(r_ids) - 1 + n_answer]
    assert torch.allclose(doc.target, torch.log_softmax(rows.float(), -1), atol=2e-3)


def test_quote_documents_map_the_whole_context_and_quote_the_choice_after_it(load_engine) -> None:  # type: ignore[no-untyped-def]
    from harness.distill_on_engines import _loss, build_docs
    from heterofold.distill import LowRankResidual
    from heterofold.select import QUOTE_SEPARATOR

    engine = load_engine("smollm2-135m-instruct")
    identity = Adapter.identity(Side.of(engine.spec))
    context = stdlib_text(700, start=11)
    ((plain, quoted),) = run(build_docs(engine, engine, identity, [context], budgets=(0.0, 0.05), path="quote",
                                       answer_tokens=8))  # fmt: skip
    ((_, recomputed),) = run(build_docs(engine, engine, identity, [context], budgets=(0.0, 0.05), answer_tokens=8))
    # recompute keeps the chosen tokens native; quote maps every aligned token and quotes them instead
    assert len(recomputed.mapped) < len(plain.mapped) == len(quoted.mapped)
    # the quoted prompt starts with the same context: its native context is the plain one's prefill, not a second
    assert torch.equal(quoted.token_ids, plain.token_ids) and quoted.native_k[0] is plain.native_k[0]
    suffix = engine.tokenizer.decode(quoted.suffix.tolist())
    head = engine.tokenizer.decode(plain.suffix.tolist())
    assert len(quoted.suffix) > len(plain.suffix) and "Question:" in suffix and "Question:" in head
    quote = suffix[: suffix.index("Question:")].strip()
    assert len(quote) > 20 and all(part.strip() in context for part in quote.split(QUOTE_SEPARATOR.strip()))
    # a model mapped to itself: the mapped context is the native one, so the answer KL is ~0
    param = LowRankResidual(identity)
    with torch.no_grad():
        assert float(_loss(engine, param, quoted)) < 1e-3
    with pytest.raises(ValueError, match="unknown distillation path"):
        run(build_docs(engine, engine, identity, [context], path="text"))


def test_fit_refuses_a_token_residual_without_a_token_map(load_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--token-residual`` fits a token map's weights: a start without one is refused before any
    document is built, as is the option on a method that does not distil."""
    from typer.testing import CliRunner

    from cli import app

    engine = load_engine("smollm2-135m-instruct")
    Adapter.identity(Side.of(engine.spec)).save(tmp_path / "plain")
    base = ["fit", "--sender", "smollm2-135m-instruct", "--receiver", "smollm2-135m-instruct"]
    result = CliRunner().invoke(app, [*base, "--method", "kv-ridge", "--token-residual", "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "--token-residual is a distilled fit's option" in result.output
    args = [*base, "--method", "distilled", "--start", str(tmp_path / "plain"), "--token-residual",
            "--out", str(tmp_path / "b")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "fits a token map's weights" in result.output
    assert not (tmp_path / "b").exists()


def test_questions_for_takes_every_template_once_before_repeating() -> None:
    import random

    from harness.distill_on_engines import QUESTIONS, _question, questions_for

    context = stdlib_text(1500, start=3)
    assert questions_for(random.Random(5), context, 1) == [_question(random.Random(5), context)]
    qs = questions_for(random.Random(5), context, len(QUESTIONS) + 1)
    heads = [next(t.split("{word}")[0] for t in QUESTIONS if q.startswith(t.split("{word}")[0])) for q in qs]
    assert len(set(heads[: len(QUESTIONS)])) == len(QUESTIONS) and heads[-1] == heads[0]


def test_documents_per_context_are_one_per_question_and_budget(load_engine) -> None:  # type: ignore[no-untyped-def]
    from harness.distill_on_engines import build_docs

    engine = load_engine("smollm2-135m-instruct")
    identity = Adapter.identity(Side.of(engine.spec))
    contexts = [stdlib_text(700, start=11), stdlib_text(700, start=17)]
    out = run(build_docs(engine, engine, identity, contexts, budgets=(0.0, 0.05), answer_tokens=4, questions=2))
    assert [len(d) for d in out] == [4, 4]  # two questions x two budgets, grouped by context
    a, b = out[0][0], out[0][2]  # the two questions' map-only documents share the context, not the suffix
    assert torch.equal(a.token_ids, b.token_ids) and not torch.equal(a.suffix, b.suffix)
    assert a.x_k[0] is b.x_k[0] and a.x_v[-1] is b.x_v[-1]  # one copy of the map's inputs per context
    with pytest.raises(ValueError, match="questions"):
        run(build_docs(engine, engine, identity, contexts, questions=0))
