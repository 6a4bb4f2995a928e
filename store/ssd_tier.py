"""The SSD tier: serialized values, one file per handle under a directory.

A file appears under its final name only complete: it is written to a temporary name and renamed
(``os.replace`` is atomic on POSIX), so a crash between write and rename leaves only a temporary
file, which the next start deletes, and never a handle. Every read checks the file's sha256 both
against the handle's recorded checksum and against the bytes themselves.

The sha256 (about 2 GB/s here) costs more than the page-cache copies, so nothing else is added to
it: a put writes the value's tensors straight from memory (``KVCache.to_parts``, no serialized
copy) and a get reads the file into fresh numpy memory whose slices become the value's tensors
(``KVCache.from_buffer``, no copy). Both hash on a second thread alongside the I/O (hashlib and
file I/O release the GIL); with ``fsync`` the hash runs while the body is flushed to disk.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import numpy as np
import torch

from heterofold.errors import KVFormatError
from heterofold.kv import HEADER_SIZE, KVCache, KVParts, header_digest, pack_header
from store.errors import PayloadCorrupt, PayloadMissing, TierFull, TierUnavailable
from store.payload import Payload
from store.tier import Stored, Tier

SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
CHUNK = 4 << 20  # bytes per read; each is hashed on the other thread while the next is read


class SsdTier(Tier):
    name = "ssd"

    def __init__(self, root: Path, budget: int, fsync: bool = False) -> None:
        """Takes stock of ``root``: deletes temporary files a crash left, and counts finished files
        as entries (the store then drops those the index does not know)."""
        super().__init__()
        self.root = Path(root)
        self.budget = budget
        self.fsync = fsync
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssd-sha256")  # one, so jobs run in order
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
        return payload.parts.nbytes

    def put(self, handle_id: str, payload: Payload) -> Stored:
        parts = payload.parts
        size = parts.nbytes
        if handle_id in self._sizes or size > self.free:
            raise TierFull(f"ssd tier: {size} bytes do not fit in {self.free} free")
        final = self.path(handle_id)
        tmp = self.root / f".{handle_id}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                digest = self._write(fd, parts)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            if self.fsync:
                self._fsync_dir()
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise TierUnavailable(f"ssd tier: cannot write {final}: {exc}") from exc
        self._sizes[handle_id] = size
        return Stored(location=str(final), nbytes=size, checksum=digest.hex())

    def _write(self, fd: int, parts: KVParts) -> bytes:
        """The body behind a blank header while the other thread hashes it, then the header with
        its digest (the file is still under its temporary name). Returns the digest."""
        digest = self._hasher.submit(parts.sha256)
        os.lseek(fd, HEADER_SIZE, os.SEEK_SET)
        for part in parts.body:
            _write_all(fd, part)
        if self.fsync:
            os.fdatasync(fd)  # the disk works while the hash finishes
        body_sha256 = digest.result()
        _write_all(fd, pack_header(body_sha256), offset=0)
        if self.fsync:
            os.fsync(fd)
        return body_sha256

    def _fsync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, handle_id: str, checksum: str) -> Payload:
        try:
            data, body_sha256 = self._read(self.path(handle_id))
        except FileNotFoundError:
            self._sizes.pop(handle_id, None)
            raise PayloadMissing(f"ssd tier has no file for {handle_id}") from None
        except OSError as exc:
            raise PayloadMissing(f"ssd tier cannot read {handle_id}: {exc}") from exc
        try:
            if header_digest(data[:HEADER_SIZE].tobytes()).hex() != checksum:
                raise KVFormatError("file checksum differs from the handle's")
            kv = KVCache.from_buffer(torch.from_numpy(data), body_sha256=body_sha256)  # checks the body against it
        except KVFormatError as exc:
            self.delete(handle_id)
            raise PayloadCorrupt(f"ssd payload {handle_id}: {exc}") from exc
        return Payload(kv, checksum)

    def _read(self, path: Path) -> tuple[np.ndarray, bytes]:
        """The file's bytes in fresh memory (numpy asks for huge pages: far fewer page faults
        than a bytes object) and the sha256 of its body, hashed a chunk behind the reads."""
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            data = np.empty(size, dtype=np.uint8)
            view = data.data
            h = hashlib.sha256()
            hashed: list[Future[None]] = []
            end = 0
            while end < size:
                n = f.readinto(view[end : end + CHUNK])
                if not n:
                    break  # the file shrank since fstat: what was read fails its checksum
                if end + n > HEADER_SIZE:
                    hashed.append(self._hasher.submit(h.update, view[max(end, HEADER_SIZE) : end + n]))
                end += n
            for job in hashed:
                job.result()
        return data[:end], h.digest()

    def delete(self, handle_id: str) -> None:
        self._sizes.pop(handle_id, None)
        # In an unwritable directory the file stays, an orphan that the next start drops.
        with suppress(OSError):
            self.path(handle_id).unlink(missing_ok=True)


def _write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """``os.write`` (or ``pwrite`` at ``offset``) until every byte is written."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        offset = None if offset is None else offset + n
