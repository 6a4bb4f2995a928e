"""What the index records about one cached value, and the typed results of store operations."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, NamedTuple, cast

TierName = Literal["device", "cpu", "ssd"]


@dataclass(frozen=True)
class HandleMeta:
    """One handle's metadata hash in Redis. ``checksum`` is the sha256 of the serialized payload,
    set once the payload has been serialized (on SSD); values that have only lived in memory
    were never serialized and carry "". ``pages`` are the chain hashes the handle is indexed
    under: every full-page boundary the value can be truncated to."""

    handle_id: str
    scope: str  # Scope.key: a digest of fingerprint, tenant salt and page size
    fingerprint: str
    tokens: int
    nbytes: int
    tier: TierName
    location: str
    checksum: str
    created: float  # unix seconds
    last_access: float
    hits: int
    pages: tuple[str, ...]

    def to_redis(self) -> dict[str, str]:
        out = {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name not in ("handle_id", "pages")}
        out["pages"] = " ".join(self.pages)
        return out

    @classmethod
    def from_redis(cls, handle_id: str, raw: dict[bytes, bytes] | dict[str, str]) -> HandleMeta:
        d = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }
        tier = d["tier"]
        if tier not in ("device", "cpu", "ssd"):
            raise ValueError(f"unknown tier {tier!r}")
        return cls(
            handle_id=handle_id,
            scope=d["scope"],
            fingerprint=d["fingerprint"],
            tokens=int(d["tokens"]),
            nbytes=int(d["nbytes"]),
            tier=cast(TierName, tier),  # checked above
            location=d["location"],
            checksum=d["checksum"],
            created=float(d["created"]),
            last_access=float(d["last_access"]),
            hits=int(d["hits"]),
            pages=tuple(d["pages"].split()),
        )


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


class Match(NamedTuple):
    """The longest cached prefix of a lookup: the first ``tokens`` tokens of the query are covered
    by handle ``meta`` (whose value may be longer; loading cuts it to ``tokens``)."""

    tokens: int
    meta: HandleMeta


class PutResult(NamedTuple):
    handle_id: str
    outcome: Literal["stored", "exists", "skipped"]
    tier: TierName | None  # where it landed, when stored
    indexed_tokens: int  # the longest prefix a later lookup can match from this value
    reason: str  # why it was skipped ("" otherwise)
