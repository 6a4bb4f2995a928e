"""The branch-confidence probe (bench/branch_confidence.py): its read-outs, its rule, and one item
through the three branches on a real receiver with an identity map."""

import asyncio
import math

import pytest
import torch

from bench.branch_confidence import SIGNALS, first_token, rule, signals
from engines.selectors import make_selector
from gateway.settings import TransferPolicy
from harness.evaluate import ItemRun
from heterofold.adapter import Adapter, Side
from heterofold.suite import builtin_suite


def test_first_token_reads_top1_and_entropy() -> None:
    _, top1, entropy = first_token(torch.zeros(8))  # uniform over 8
    assert top1 == pytest.approx(1 / 8) and entropy == pytest.approx(math.log(8))
    _, top1, entropy = first_token(torch.tensor([50.0, 0.0, 0.0]))  # all but certain
    assert top1 == pytest.approx(1.0) and entropy == pytest.approx(0.0, abs=1e-6)


def test_the_rule_takes_the_side_that_splits_the_first_length_and_counts_the_rest() -> None:
    def row(kind: str, length: int, value: float) -> dict[str, object]:
        return {"kind": kind, "length": length, "s": value}

    rows = [row("paraphrase", 1, 0.1), row("paraphrase", 1, 0.2), row("summary", 1, 0.5), row("continue", 1, 0.9),
            row("paraphrase", 2, 0.6), row("summary", 2, 0.1)]  # fmt: skip
    got = rule(rows, "s", [1, 2])
    assert got["paraphrase_side"] == "low" and got["wrong_at_fitted"]["1"] == 0
    assert got["threshold"] == pytest.approx(0.2)  # paraphrases at or below it
    assert got["wrong_at_fitted"]["2"] == 2 and got["fewest_wrong"]["2"] == 0  # flipped at 2: both misplaced
    assert got["of"] == {"1": 4, "2": 2}


@pytest.mark.models
def test_with_an_identity_map_the_mapped_branches_read_the_native_context(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    item = builtin_suite(lengths=(256,), per_cell=1, kinds=("paraphrase",))[0]
    identity = Adapter.identity(Side.of(engine.spec))
    run = ItemRun(engine, engine, item, 1, 16)

    async def go() -> dict[str, float]:
        await run.prepare_transfer(make_selector(TransferPolicy().selector), identity, None)
        return await signals(run, identity, 0.05)

    got = asyncio.run(go())
    assert set(got) == set(SIGNALS)
    native = asyncio.run(engine.score(run.r_ids))[-1]
    _, top1, entropy = first_token(native)
    # transfer with an identity map is the native cache: the same first token distribution
    assert got["transfer top-1 p"] == pytest.approx(top1, abs=2e-3)
    assert got["transfer entropy"] == pytest.approx(entropy, abs=2e-2)
    assert got["branch KL"] >= 0.0 and all(0.0 < got[f"{b} top-1 p"] <= 1.0 for b in ("quote", "map+quote"))
