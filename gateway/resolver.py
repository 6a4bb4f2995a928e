"""Which adapter serves a (sender fingerprint, receiver fingerprint) pair, loaded and verified.

The hot path never waits on SQL: the set of active and shadow versions is a snapshot refreshed in
the background every ``refresh_s`` (and at once after an admin change on this replica). Artifacts
are loaded once per version and kept; ``Adapter.load`` checks the weights' sha256 against the
manifest and the fingerprints against the pair, and the manifest's sha256 must be the registry's.
A version whose artifact fails is not retried until the snapshot changes or ``retry_s`` passes.
Keys are fingerprints, so a version fitted for other weights (stale) is never looked up.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.registry import versions
from gateway.registry.db import Database
from heterofold.adapter import MANIFEST, Adapter
from heterofold.errors import AdapterError

Pair = tuple[str, str]


@dataclass(frozen=True)
class VersionRef:
    id: int
    version: str
    status: str
    sender_name: str
    receiver_name: str
    sender_fingerprint: str
    receiver_fingerprint: str
    artifact_path: str
    sha256: str

    @property
    def pair(self) -> Pair:
        return self.sender_fingerprint, self.receiver_fingerprint


@dataclass(frozen=True)
class Resolved:
    ref: VersionRef
    adapter: Adapter


class AdapterResolver:
    def __init__(self, db: Database, *, refresh_s: float = 2.0, retry_s: float = 30.0) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self._active: dict[Pair, VersionRef] = {}
        self._shadow: dict[Pair, list[VersionRef]] = {}
        self._loaded: dict[tuple[int, str], Adapter] = {}
        self._failed: dict[tuple[int, str], tuple[float, AdapterError]] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        rows = await asyncio.to_thread(self._read)
        active: dict[Pair, VersionRef] = {}
        shadow: dict[Pair, list[VersionRef]] = {}
        for ref in rows:
            if ref.status == "active":
                active[ref.pair] = ref
            else:
                shadow.setdefault(ref.pair, []).append(ref)
        self._active, self._shadow = active, shadow
        self._fetched_at = time.monotonic()

    def _read(self) -> list[VersionRef]:
        with self.db.session() as session:
            return [
                VersionRef(
                    r.id,
                    r.version,
                    r.status,
                    r.sender_name,
                    r.receiver_name,
                    r.sender_fingerprint,
                    r.receiver_fingerprint,
                    r.artifact_path,
                    r.sha256,
                )
                for r in versions.serving(session=session)
            ]

    def invalidate(self) -> None:
        self._fetched_at = 0.0
        self._failed.clear()

    async def _fresh(self) -> None:
        if time.monotonic() - self._fetched_at > self.refresh_s:
            async with self._lock:
                if time.monotonic() - self._fetched_at > self.refresh_s:
                    await self.refresh()

    async def active(self, pair: Pair) -> Resolved | None:
        """The pair's active version, loaded; None when it has none. Raises AdapterError (or
        FingerprintMismatch) when its artifact cannot be used, and RegistryError when SQL fails."""
        await self._fresh()
        ref = self._active.get(pair)
        return None if ref is None else Resolved(ref, await self.load(ref))

    async def shadows(self, pair: Pair) -> list[VersionRef]:
        await self._fresh()
        return list(self._shadow.get(pair, ()))

    def known_active(self) -> list[VersionRef]:
        return list(self._active.values())

    async def load(self, ref: VersionRef) -> Adapter:
        key = (ref.id, ref.sha256)
        if key in self._loaded:
            return self._loaded[key]
        failed = self._failed.get(key)
        if failed and time.monotonic() - failed[0] < self.retry_s:
            raise failed[1]
        try:
            adapter = await asyncio.to_thread(load_verified, ref)
        except AdapterError as exc:
            self._failed[key] = (time.monotonic(), exc)
            raise
        self._loaded[key] = adapter
        return adapter


def load_verified(ref: VersionRef) -> Adapter:
    folder = Path(ref.artifact_path)
    try:
        recorded = json.loads((folder / MANIFEST).read_text()).get("weights_sha256")
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"adapter {ref.version}: cannot read its manifest: {exc}") from exc
    if recorded != ref.sha256:
        raise AdapterError(f"adapter {ref.version}: artifact sha256 is not the registry's")
    return Adapter.load(
        folder, sender_fingerprint=ref.sender_fingerprint, receiver_fingerprint=ref.receiver_fingerprint
    )
