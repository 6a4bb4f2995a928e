"""Request and response shapes of the OpenAI chat-completions API, plus the ``heterofold`` usage
block. Input shapes ignore unknown fields (clients send more than we use); output shapes are ours."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Path = Literal["native", "prefix", "transfer", "map_quote", "quote"]
# Printable ASCII without spaces: the id is echoed in the ``x-conversation-id`` response header.
CONVERSATION_ID = r"^[!-~]{1,200}$"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str

    def as_engine_message(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # the role; the path names it on /v1/agents/{role}
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)
    user: str | None = None
    conversation_id: str | None = Field(None, pattern=CONVERSATION_ID)
    kv_reuse: bool = True  # HeteroFold extension: false = plain native prefill, nothing reused or stored

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class HeteroFoldUsage(BaseModel):
    path: Path
    adapter_version: str | None = None
    selector: str | None = None  # which selector chose the spans recomputed or quoted (engines/selectors.py)
    tokens_transferred: int = 0
    tokens_recomputed: int = 0
    transfer_ms: float = 0.0
    ttft_ms: float = 0.0
    prefill_ms_saved: float = 0.0  # estimated from the engine's measured prefill rate
    fallback: str | None = None  # why a transfer was tried and not used
    engine_ms: float = 0.0  # time inside the engine (queue, prefill, decode)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    heterofold: HeteroFoldUsage


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    conversation_id: str | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "heterofold"
    engine: str
    engine_model: str
    family: str
    description: str = ""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
