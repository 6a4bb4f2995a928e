"""Every Redis key the store writes, in one place.

Layout under ``prefix`` (default ``hf``) and ``node`` (one store per node and data directory):

    {prefix}:{node}:page:{scope}:{chain}   SET    handle ids whose value covers this page-aligned prefix
    {prefix}:{node}:handle:{handle}        HASH   handle metadata (see ``HandleMeta``)
    {prefix}:{node}:lru                    ZSET   handle id -> last access (unix seconds)
    {prefix}:{node}:usage                  HASH   tier name -> bytes held, for the dashboard
    {prefix}:{node}:owner                  STRING the live process that holds the node (``store/lease.py``)
    {prefix}:events                        STREAM kv.* / prefill.saved / oom.alert events of all nodes

Payloads live in this node's tiers, so the index is per node: a replica never matches a handle
whose bytes sit in another process's memory. ``scope`` is a digest, so the tenant salt never
appears in Redis in clear. Every key carries a TTL; nothing here is ever found with KEYS or SCAN.

Other Redis keys:

    {prefix}:conv:...      the gateway's conversations (``gateway/conversations.py``)
    {prefix}:hicache:...   SGLang HiCache pages and their geometry (``store/hicache/page_keys.py``)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str
    node: str

    def __post_init__(self) -> None:
        for name, value in (("prefix", self.prefix), ("node", self.node)):
            if not value or any(c in value for c in ": \n"):
                raise ValueError(f"key {name} must be non-empty without ':' or spaces, got {value!r}")

    @property
    def _base(self) -> str:
        return f"{self.prefix}:{self.node}"

    @property
    def page_prefix(self) -> str:
        """Prefix of every page key; the remove script appends ``{scope}:{chain}`` to it."""
        return f"{self._base}:page:"

    def page(self, scope: str, chain_hash: str) -> str:
        return f"{self.page_prefix}{scope}:{chain_hash}"

    @property
    def handle_prefix(self) -> str:
        """Prefix of every handle key; the lookup script appends a handle id to it."""
        return f"{self._base}:handle:"

    def handle(self, handle_id: str) -> str:
        return self.handle_prefix + handle_id

    @property
    def lru(self) -> str:
        return f"{self._base}:lru"

    @property
    def usage(self) -> str:
        return f"{self._base}:usage"

    @property
    def owner(self) -> str:
        return f"{self._base}:owner"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"
