"""One live process per store node: a lease in Redis, held while the store is open.

A node's index names payloads that only its own process (CPU tier) and data directory (SSD tier)
hold, and a store reconciles its node's index at start by dropping every handle whose payload it
cannot find. Two gateways on one Redis under the same node name would therefore delete each
other's index and serve each other's handles as misses. So a store takes the node's lease before
it reconciles, and keeps it:

    {prefix}:{node}:owner   STRING  "host:pid:token" of the holder, expires after ``ttl_s``

The holder refreshes it every ``ttl_s / 3`` on a daemon thread and deletes it on ``close``. A start
that finds the lease held waits up to one ``ttl_s`` (a holder that was killed lets it lapse), then
fails with ``NodeInUse``, naming the holder. A refresh that finds the lease gone (Redis restarted,
or was unreachable for longer than ``ttl_s``) takes it again; one that finds another holder logs
an error and keeps trying, since that holder is now the one reconciling.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import redis

from store.connection import redis_errors
from store.errors import NodeInUse

NODE_FILE = "node"  # under a gateway's data_dir: the node name it derived (no store.node set)

log = logging.getLogger(__name__)

# KEYS[1] owner key; ARGV[1] our value, ARGV[2] ttl ms. 1: held by us (refreshed or re-taken),
# 0: another holder has it.
_REFRESH = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class NodeLease:
    def __init__(self, client: redis.Redis, key: str, node: str, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError("the node lease's ttl_s must be positive")
        self.client, self.key, self.node, self.ttl_s = client, key, node, ttl_s
        self.value = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh = client.register_script(_REFRESH)
        self._release = client.register_script(_RELEASE)

    def acquire(self, wait_s: float | None = None) -> None:
        """Take the lease, waiting up to ``wait_s`` (default ``ttl_s``) for another holder's to
        lapse; raise ``NodeInUse`` if it does not. Raises ``StoreUnavailable`` if Redis is down."""
        deadline = time.monotonic() + (self.ttl_s if wait_s is None else wait_s)
        ms = max(1, int(self.ttl_s * 1000))
        while True:
            with redis_errors("node lease"):
                if self.client.set(self.key, self.value, nx=True, px=ms):
                    break
                raw = self.client.get(self.key)
                holder = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                if holder == self.value:
                    break
            if time.monotonic() >= deadline:
                who = holder or "another process"
                raise NodeInUse(
                    f"store node {self.node!r} is in use by {who} on this Redis: give each gateway replica its own "
                    f"store.node (or its own data_dir), or wait {self.ttl_s:g} s after that gateway has stopped"
                )
            time.sleep(min(0.25, self.ttl_s / 4))
        self.held = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name=f"lease:{self.node}", daemon=True)
            self._thread.start()

    def _keep(self) -> None:
        ms = max(1, int(self.ttl_s * 1000))
        while not self._stop.wait(self.ttl_s / 3):
            try:
                mine = bool(self._refresh(keys=[self.key], args=[self.value, ms]))
            except redis.exceptions.RedisError as exc:
                log.warning("store node %r: lease not refreshed (Redis: %s)", self.node, exc)
                continue
            if not mine and self.held:
                log.error("store node %r: another process holds its lease; give each replica its own node", self.node)
            self.held = mine

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if self.held:
            try:
                self._release(keys=[self.key], args=[self.value])
            except redis.exceptions.RedisError as exc:  # it lapses on its own
                log.warning("store node %r: lease not released (Redis: %s)", self.node, exc)
            self.held = False


def data_dir_node(data_dir: Path) -> str:
    """The node name of a gateway's data directory (which holds its store: SSD tier, embedded
    Redis): read from ``data_dir/node``, or made up once as ``{host}-{random}`` and written there.
    A node is the identity of its data directory, so a restart on the same directory finds its
    payloads again, and every replica with its own directory gets its own node without
    configuring one."""
    path = data_dir / NODE_FILE
    if path.is_file():
        name = path.read_text().strip()
        if name:
            return name
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "node"
    name = f"{host}-{uuid.uuid4().hex[:8]}"
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(name + "\n")
    tmp.replace(path)
    return name
