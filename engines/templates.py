"""Prompt rendering: the model's own chat template, or the plain template for base models.

The plain template, for models without a chat template (gemma3-270m is a base model):

    {system}\\n\\n                 only when the first message is a system message
    User: {content}\\n\\n          one block per user message
    Assistant: {content}\\n\\n     one block per assistant message
    Assistant:                   the generation prompt

The model's tokenizer adds BOS where it does (Gemma: ``<bos>``); the text never contains it.
Generation under the plain template stops at ``PLAIN_STOP``, where the model starts a new turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engines.base import Encoding
from engines.errors import BadPrompt

if TYPE_CHECKING:
    from heterofold.spec import ModelSpec

ROLES = ("system", "user", "assistant")
PLAIN_STOP = ("\nUser:",)
_PLAIN_LABEL = {"user": "User", "assistant": "Assistant"}


def check_messages(messages: Sequence[dict[str, Any]]) -> None:
    if not messages:
        raise BadPrompt("messages must not be empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadPrompt(f"messages[{i}] needs a role in {ROLES} and a string content")
        if m["role"] == "system" and i != 0:
            raise BadPrompt(f"messages[{i}]: a system message may only come first")


def render(messages: Sequence[dict[str, Any]], template: str, tokenizer: Any) -> str:
    """The prompt text for ``messages``, ending where the assistant's reply begins."""
    check_messages(messages)
    if template == "chatml":
        text: str = tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        return text
    if template == "plain":
        return render_plain(messages)
    raise BadPrompt(f"unknown template {template!r}")


def render_plain(messages: Sequence[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        if m["role"] == "system":
            parts.append(f"{m['content']}\n\n")
        else:
            parts.append(f"{_PLAIN_LABEL[m['role']]}: {m['content']}\n\n")
    parts.append("Assistant:")
    return "".join(parts)


def default_stops(template: str) -> tuple[str, ...]:
    return PLAIN_STOP if template == "plain" else ()


class TokenizerText:
    """Text work through a Hugging Face fast tokenizer, shared by the engines that hold one as
    ``self.tokenizer`` beside their ``self.spec``: encode with character offsets, decode, render."""

    tokenizer: Any
    spec: ModelSpec

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Encoding:
        enc = self.tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        return Encoding(ids=tuple(enc["input_ids"]), offsets=tuple(map(tuple, enc["offset_mapping"])))

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        return render(messages, self.spec.template, self.tokenizer)
