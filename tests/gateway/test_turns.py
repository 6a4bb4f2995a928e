"""What the conversation records of a finished turn: the tokens its exported KV holds, with their offsets."""

from types import SimpleNamespace
from typing import Any, cast

from engines.base import Completion
from gateway.engine_pool import PooledEngine
from gateway.turns import FinishedTurn, covered_turn

PROMPT = "<s>user: hello there</s>"
PROMPT_OFFSETS = ((0, 3), (3, 8), (8, 14), (14, 20), (20, 24))  # five prompt tokens
VOCAB = {1: " Hi", 2: "!", 3: " Bye"}


def decode(ids: Any) -> str:
    return "".join(VOCAB[i] for i in ids)


def finished() -> FinishedTurn:
    pooled = cast(
        PooledEngine, SimpleNamespace(name="reader", engine=SimpleNamespace(spec=SimpleNamespace(fingerprint="f")))
    )
    return FinishedTurn(pooled, "t", "c", PROMPT, PROMPT_OFFSETS, cast(Completion, None))


def test_a_turn_holds_the_prompt_and_the_reply_tokens_its_kv_holds() -> None:
    turn = covered_turn(finished(), [10, 11, 12, 13, 14, 1, 2], decode)  # the last reply token (3) has no KV yet
    assert turn.token_ids == (10, 11, 12, 13, 14, 1, 2)
    assert turn.offsets == (*PROMPT_OFFSETS, (24, 27), (27, 28))
    assert turn.text == PROMPT + " Hi!" and (turn.engine, turn.fingerprint) == ("reader", "f")


def test_a_kv_kept_in_whole_pages_may_hold_less_than_the_prompt() -> None:
    # SGLang's storage keeps whole pages: 4 of the 5 prompt tokens. The record must still be
    # consistent (one offset per token), or the conversation would not be recorded at all.
    turn = covered_turn(finished(), [10, 11, 12, 13], decode)
    assert turn.token_ids == (10, 11, 12, 13) and turn.offsets == PROMPT_OFFSETS[:4]
    assert turn.text == PROMPT  # the text stays whole: sections are aligned on it
