"""The SSD tier: serialized values, one file per handle under a directory.

A file appears under its final name only complete: it is written to a temporary name and renamed
(``os.replace`` is atomic on POSIX), so a crash between write and rename leaves only a temporary
file, which the next start deletes, and never a handle. Every read checks the file's sha256 both
against the handle's recorded checksum and against the bytes themselves (``KVCache.from_bytes``).
"""

from __future__ import annotations

import os
import uuid
from contextlib import suppress
from pathlib import Path

from heterofold.errors import KVFormatError
from heterofold.kv import KVCache
from store.errors import PayloadCorrupt, PayloadMissing, TierFull, TierUnavailable
from store.payload import Payload, blob_checksum
from store.tier import Stored, Tier

SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"


class SsdTier(Tier):
    name = "ssd"

    def __init__(self, root: Path, budget: int, fsync: bool = False) -> None:
        """Takes stock of ``root``: deletes temporary files a crash left, and counts finished files
        as entries (the store then drops those the index does not know)."""
        super().__init__()
        self.root = Path(root)
        self.budget = budget
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for entry in os.scandir(self.root):
                if entry.name.endswith(TEMP_SUFFIX):
                    os.unlink(entry.path)
                elif entry.name.endswith(SUFFIX) and entry.is_file():
                    self._sizes[entry.name[: -len(SUFFIX)]] = entry.stat().st_size
        except OSError as exc:
            raise TierUnavailable(f"ssd tier: cannot use {self.root}: {exc}") from exc

    def path(self, handle_id: str) -> Path:
        return self.root / f"{handle_id}{SUFFIX}"

    def size_of(self, payload: Payload) -> int:
        return len(payload.blob)

    def put(self, handle_id: str, payload: Payload) -> Stored:
        blob = payload.blob
        if handle_id in self._sizes or len(blob) > self.free:
            raise TierFull(f"ssd tier: {len(blob)} bytes do not fit in {self.free} free")
        final = self.path(handle_id)
        tmp = self.root / f".{handle_id}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
        try:
            with open(tmp, "xb") as f:
                f.write(blob)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, final)
            if self.fsync:
                self._fsync_dir()
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise TierUnavailable(f"ssd tier: cannot write {final}: {exc}") from exc
        self._sizes[handle_id] = len(blob)
        return Stored(location=str(final), nbytes=len(blob), checksum=payload.checksum)

    def _fsync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, handle_id: str, checksum: str) -> Payload:
        try:
            blob = self.path(handle_id).read_bytes()
        except FileNotFoundError:
            self._sizes.pop(handle_id, None)
            raise PayloadMissing(f"ssd tier has no file for {handle_id}") from None
        except OSError as exc:
            raise PayloadMissing(f"ssd tier cannot read {handle_id}: {exc}") from exc
        try:
            if blob_checksum(blob) != checksum:
                raise KVFormatError("file checksum differs from the handle's")
            kv = KVCache.from_bytes(blob)  # verifies the bytes against that checksum
        except KVFormatError as exc:
            self.delete(handle_id)
            raise PayloadCorrupt(f"ssd payload {handle_id}: {exc}") from exc
        return Payload(kv, blob)

    def delete(self, handle_id: str) -> None:
        self._sizes.pop(handle_id, None)
        # In an unwritable directory the file stays, an orphan that the next start drops.
        with suppress(OSError):
            self.path(handle_id).unlink(missing_ok=True)
