"""Two gateway replicas: two ``heterofold serve`` processes on one Redis and one PostgreSQL, as a
load balancer without sticky routing would use them. Each has its own data directory (so its own
store node and tiers) and both read one artifacts folder. A hop that lands on the replica that
does not hold the sender's KV misses cleanly and prefills natively, counted as a fallback; a hop
on the same replica takes its prefix or transfer. Every native or prefix answer must equal the
native greedy answer, a replica killed between two hops loses nothing (the conversation lives in
Redis), and a restarted replica takes its node back once the killed holder's lease lapses. A fit
job started on one replica is shown and cancelled by the other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
import pytest
import yaml

from store.redis_server import EmbeddedRedis
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, GEMMA, SMOL
from tests.gateway.helpers import upload
from tests.reliability.conftest import (
    Messages,
    answer,
    chat,
    eventually,
    free_port,
    metric,
    native,
    opening,
    roles,
    then,
)

pytestmark = pytest.mark.models
LEASE_S = 2.0  # the store node's lease: a killed replica's node is free this long after


@dataclass
class Replica:
    """One ``heterofold serve`` process."""

    name: str
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def write_config(path: Path, *, redis_url: str, database_url: str, artifacts: Path) -> Path:
    policies = {name: role.model_dump(mode="json") for name, role in roles().items()}
    config: dict[str, Any] = {
        "database_url": database_url,
        "artifacts_dir": str(artifacts),
        "engines": {name: {"model": name, "max_prompt_tokens": 2048, "max_tokens": 64} for name in (SMOL, GEMMA)},
        "roles": policies,
        "auth": {"client_keys": [CLIENT_KEY], "admin_key": ADMIN_KEY},
        "shadow": {"sample_rate": 0.0, "shadow_rate": 0.0},
        "store": {
            "redis_url": redis_url,
            "cpu_budget_bytes": 1 << 30,
            "ssd_budget_bytes": 1 << 30,
            "node_lease_s": LEASE_S,
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def cluster(tmp_path: Path, postgres_schema: str) -> Iterator[Callable[[str], Replica]]:
    """Starts replicas on one embedded Redis of the test's own and one PostgreSQL schema; each
    replica's data directory is ``tmp_path/<name>`` (a restart under the same name reuses it)."""
    redis_server = EmbeddedRedis(tmp_path / "redis").start()
    database_url = (
        f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options={quote(f'-csearch_path={postgres_schema}')}"
    )
    config = write_config(tmp_path / "heterofold.yaml", redis_url=redis_server.url, database_url=database_url,
                          artifacts=tmp_path / "shared-adapters")  # fmt: skip
    started: list[Replica] = []
    logs: list[IO[bytes]] = []

    def start(name: str) -> Replica:
        port, log = free_port(), tmp_path / f"{name}-{len(started)}.log"
        out = log.open("wb")
        logs.append(out)
        env = {**os.environ, "HETEROFOLD_DATA_DIR": str(tmp_path / name)}
        env.pop("HETEROFOLD_CONFIG", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        replica = Replica(name, f"http://127.0.0.1:{port}", tmp_path / name, proc, log)
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for r in started:
            if r.alive():
                r.proc.terminate()
                try:
                    r.proc.wait(60)
                except subprocess.TimeoutExpired:
                    r.kill()
        for out in logs:
            out.close()
        redis_server.stop()


def wait_ready(*replicas: Replica, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    for r in replicas:
        while True:
            if not r.alive():
                raise AssertionError(f"replica {r.name} exited: {r.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{r.url}/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"replica {r.name} not ready in {timeout_s} s: {r.log.read_text()[-3000:]}")
            time.sleep(0.5)


def node_of(replica: Replica) -> str:
    return (replica.data_dir / "node").read_text().strip()


def settle(*replicas: Replica) -> None:
    """After-turn work (storing the turn's KV) runs in the background: wait until each replica's
    ``heterofold_background_pending`` reads 0 (the task is spawned as the answer is sent, hence the
    short wait first)."""
    time.sleep(0.5)
    for r in replicas:
        eventually(lambda r=r: metric(r, "heterofold_background_pending") == 0, 60, f"{r.name} idle")


def test_two_replicas_alternating_hops_answer_natively_and_one_killed_loses_nothing(
    cluster: Callable[[str], Replica], fitted_adapter: Path
) -> None:
    a, b = cluster("a"), cluster("b")
    wait_ready(a, b)
    assert node_of(a) != node_of(b)  # a node per data directory, none configured
    upload(a, fitted_adapter)  # smollm2 -> gemma3, active; written under the shared artifacts folder
    eventually(lambda: len(b.http().get("/admin/adapters").json()) == 1, what="b sees a's upload")

    # Sticky: every hop of a conversation on one replica takes the KV it holds.
    sticky: Messages = opening(31, 900)
    text, hf, _ = answer(chat(a, "executor", sticky, "sticky"))
    assert hf["path"] == "native"
    settle(a)
    sticky_summary = then(sticky, text, "Summarize the text above in one sentence.")
    _, hf, _ = answer(chat(a, "summarizer", sticky_summary, "sticky"))
    assert hf["path"] == "transfer" and hf["fallback"] is None and hf["tokens_transferred"] > 0, hf

    # Alternating: hop n on replica n % 2. The other replica's KV is out of reach: a clean miss.
    misses = 0
    paths: list[str] = []
    for i in range(3):
        conversation = f"alt-{i}"
        messages = opening(40 + i, 900)
        for hop, role in enumerate(("executor", "reviewer", "summarizer", "executor")):
            here, there = (a, b) if (hop + i) % 2 == 0 else (b, a)
            text, hf, cached = answer(chat(here, role, messages, conversation))
            paths.append(hf["path"])
            assert hf["path"] in ("native", "prefix"), hf  # never a transfer of KV this replica lacks
            assert text == native(there, role, messages), (conversation, hop, role)  # either replica's native answer
            if hop > 0:
                assert hf["path"] == "native" and cached == 0 and hf["fallback"] == "SenderKVMissing", hf
                misses += 1
            settle(here)
            messages = then(messages, text, f"Question {hop}: name one word from the text.")
    counted = sum(metric(r, 'heterofold_transfer_fallbacks_total{reason="SenderKVMissing",stage="transfer"}')
                  for r in (a, b))  # fmt: skip
    assert misses == 9 and counted == misses, (misses, counted, paths)

    # b is killed between two hops of a conversation; a goes on with it, then b comes back on its node.
    messages = opening(50, 900)
    text, _, _ = answer(chat(a, "executor", messages, "killed"))
    settle(a)
    messages = then(messages, text, "Shorter, please.")
    text, _, _ = answer(chat(b, "reviewer", messages, "killed"))
    settle(b)
    b.kill()
    messages = then(messages, text, "Summarize it.")
    text, hf, _ = answer(chat(a, "summarizer", messages, "killed"))  # b's KV died with it
    assert hf["path"] == "native" and hf["fallback"] == "SenderKVMissing" and text == native(a, "summarizer", messages)
    b2 = cluster("b")  # the same data directory: the same node, once the killed holder's lease lapses
    wait_ready(b2)
    assert node_of(b2) == node_of(b)  # it could only start once the killed holder's lease lapsed
    settle(a)
    messages = then(messages, text, "Thanks. One more word?")
    text, hf, _ = answer(chat(b2, "executor", messages, "killed"))
    assert hf["path"] == "native" and text == native(a, "executor", messages)
    with b2.http() as admin:
        assert admin.get("/admin/adapters").json()[0]["status"] == "active"  # the registry is shared

    # A fit started on a is shown by b2 with a's name, and b2 cancels it: a's fit stops.
    with a.http() as admin_a, b2.http() as admin_b:
        r = admin_a.post("/admin/fits", json={"sender": GEMMA, "receiver": SMOL, "method": "kv-ridge", "docs": 2,
                                              "max_tokens": 64})  # fmt: skip
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        seen = admin_b.get(f"/admin/fits/{job_id}").json()
        assert seen["replica"] == node_of(a) and seen["status"] in ("queued", "running") and not seen["stale"]
        assert any(j["id"] == job_id for j in admin_b.get("/admin/fits").json())
        r = admin_b.post(f"/admin/fits/{job_id}/cancel")
        assert r.status_code == 200, r.text
        eventually(lambda: admin_a.get(f"/admin/fits/{job_id}").json()["status"] == "cancelled", 60, "cancelled on a")
        assert admin_b.get(f"/admin/fits/{job_id}").json()["adapter_id"] is None
        assert len(admin_a.get("/admin/adapters").json()) == 1  # the cancelled fit registered nothing


def test_a_second_replica_on_the_same_data_directory_refuses_to_start(cluster: Callable[[str], Replica]) -> None:
    first = cluster("a")
    wait_ready(first)
    second = cluster("a")  # same data directory: same store node on the same Redis
    second.proc.wait(120)
    assert second.proc.returncode != 0
    assert "is in use by" in second.log.read_text() and first.alive()
    assert httpx.get(f"{first.url}/health/ready", timeout=30).status_code == 200
