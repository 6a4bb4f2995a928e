"""Fault injectors for the reliability suite. Each is the real thing where this machine allows it:
a redis-server killed with SIGKILL, a directory the kernel refuses to write, a filesystem that is
really full, a database port that really refuses connections. The one fake is ``FaultyEngine``, a
test-only wrapper around a real engine that raises or goes silent on demand."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import resource
import select
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from engines.base import Completion, Encoding, Engine, Export, SamplingParams, StreamEvent, Timings
from heterofold.kv import KVCache

FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(path: Path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = int.from_bytes(buf, "little")
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags.to_bytes(4, "little"))
    finally:
        os.close(fd)


def _writable(path: Path) -> bool:
    probe = path / ".probe"
    try:
        probe.write_bytes(b"x")
    except OSError:
        return False
    probe.unlink()
    return True


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """The kernel refuses to create files in ``path``: mode 0555, and for root (whom modes do not
    stop) the immutable attribute. Checked before the block runs."""
    mode = path.stat().st_mode
    os.chmod(path, 0o555)
    immutable = os.geteuid() == 0
    if immutable:
        _set_immutable(path, True)
    try:
        assert not _writable(path), f"{path} is still writable: the fault was not injected"
        yield
    finally:
        if immutable:
            _set_immutable(path, False)
        os.chmod(path, mode)


@contextlib.contextmanager
def small_disk(path: Path, size_mib: int) -> Iterator[str]:
    """``path`` on a filesystem of ``size_mib``: a tmpfs mounted there (root with CAP_SYS_ADMIN),
    else the file-size limit of this process (RLIMIT_FSIZE, SIGXFSZ ignored) for writes made while
    the disk is filled. Yields the kind ("tmpfs" or "rlimit")."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)]
    if os.geteuid() == 0 and subprocess.run(mount, capture_output=True, check=False).returncode == 0:
        try:
            yield "tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(path)], check=True)
    else:
        yield "rlimit"


@contextlib.contextmanager
def disk_full(path: Path, kind: str, leave_bytes: int) -> Iterator[None]:
    """Fill the filesystem under ``path`` until ``leave_bytes`` are free (tmpfs: a filler file,
    really ENOSPC), or cap this process's file size at ``leave_bytes`` (rlimit: EFBIG). Undone
    (filler deleted, limit restored) when the block ends: the operator freed space."""
    if kind == "tmpfs":
        filler = path / "filler.bin"
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
        with filler.open("wb") as f:
            f.write(b"\0" * max(0, free - leave_bytes))
        try:
            yield
        finally:
            filler.unlink()
    else:
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (leave_bytes, old[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, handler)


class TcpProxy:
    """A TCP forwarder on a fixed loopback port to ``target``. ``down()`` closes the port and every
    connection (the database is unreachable: connections are refused); ``up()`` opens it again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


Mode = Literal["ok", "raise", "raise-midway", "hang"]


class FaultyEngine(Engine):
    """Test-only: a real engine whose ``stream`` fails on demand. ``raise``: before the first
    token; ``raise-midway``: after the first token; ``hang``: the real engine starts (it holds
    its queue slot), then nothing more is sent until the stream is cancelled."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.mode: Mode = "ok"

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Encoding:
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        return self.inner.render(messages)

    async def prefill(
        self, ids: Sequence[int], *, past: KVCache | None = None, dense: bool = False
    ) -> tuple[KVCache, Timings]:
        return await self.inner.prefill(ids, past=past, dense=dense)

    async def recompute(self, dense: KVCache, positions: Sequence[int]) -> KVCache:
        return await self.inner.recompute(dense, positions)

    async def score(self, ids: Sequence[int], *, past: KVCache | None = None) -> torch.Tensor:
        return await self.inner.score(ids, past=past)

    async def stream(
        self, ids: Sequence[int], params: SamplingParams, *, past: KVCache | None = None, export: Export = "none"
    ) -> AsyncIterator[StreamEvent]:
        mode = self.mode
        if mode == "raise":
            raise RuntimeError("injected fault: the engine raised")
        events = self.inner.stream(ids, params, past=past, export=export)
        try:
            async for event in events:
                if mode == "hang":
                    await asyncio.Event().wait()  # silent until cancelled
                yield event
                if mode == "raise-midway" and not isinstance(event, Completion):
                    raise RuntimeError("injected fault: the engine raised mid-stream")
        finally:
            await events.aclose()  # type: ignore[attr-defined]
