"""``heterofold bench gateway``: the latency the gateway adds over calling the engine object
directly, in one run, on the same prompts, interleaved.

The gateway runs in a child process under uvicorn on loopback (its own copy of smollm2, one role,
auth on), as a real client would meet it: a client in the server's process would wait for the
GIL while the server finishes a request. The client is httpx. Per prompt, the direct call renders,
tokenizes and runs ``engine.complete`` with the same sampling parameters; the gateway call sends
the same messages over HTTP. Reported:
p50 of each, and the added latency measured two ways:
- ``added_p50_ms``: p50 of (gateway wall - direct wall), paired per prompt; honest but noisy, since
  the engine's own time (tens to thousands of ms on a shared CPU) varies from call to call;
- ``overhead_p50_ms`` (the target's number): p50 of the paired difference of each side's time
  outside the engine, i.e. wall time minus the engine's own time from submission to the last
  token (the usage block's ``engine_ms`` for the gateway, the Completion's timings for the direct
  call). The direct side's remainder is its render and tokenization; the gateway's adds HTTP, auth,
  validation, the hop decision and the response.
With ``asgi`` the gateway runs in this process, called through httpx's ASGI transport: its own
code, without loopback sockets and the OS waking two more processes' threads per request.
With ``reuse`` the role also looks up and stores KV (the store, the conversation record and the
turn export), as in production; without it the engine call is the very same as the direct one.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.zoo import Zoo
from gateway.app import create_app
from gateway.engine_pool import EnginePool, PooledEngine
from gateway.settings import AuthSettings, EngineSettings, GenerationDefaults, RoleSettings, Settings, TransferPolicy

MODEL = "smollm2-135m-instruct"
KEY = "sk-bench"


@dataclass
class Result:
    requests: int
    direct_ms: list[float]
    gateway_ms: list[float]
    direct_outside_ms: list[float]  # wall minus engine time, per request
    gateway_outside_ms: list[float]

    def summary(self) -> dict[str, Any]:
        def q(xs: list[float], p: float) -> float:
            return round(statistics.quantiles(xs, n=100)[int(p * 100) - 1], 2) if len(xs) > 1 else round(xs[0], 2)

        walls = [g - d for g, d in zip(self.gateway_ms, self.direct_ms, strict=True)]
        outside = [g - d for g, d in zip(self.gateway_outside_ms, self.direct_outside_ms, strict=True)]
        return {
            "requests": self.requests,
            "direct_p50_ms": q(self.direct_ms, 0.5),
            "gateway_p50_ms": q(self.gateway_ms, 0.5),
            "added_p50_ms": q(walls, 0.5),
            "overhead_p50_ms": q(outside, 0.5),
            "overhead_p90_ms": q(outside, 0.9),
            "direct_outside_engine_p50_ms": q(self.direct_outside_ms, 0.5),
            "gateway_outside_engine_p50_ms": q(self.gateway_outside_ms, 0.5),
            "target_p50_ms": 5.0,
        }


def _prompts(n: int) -> list[str]:
    topics = ("caches", "queues", "compilers", "tokenizers", "databases", "networks", "schedulers", "allocators")
    return [f"Request {i}: in one short sentence, what are {topics[i % len(topics)]} for?" for i in range(n)]


def _settings(data_dir: Path, max_tokens: int, reuse: bool) -> Settings:
    policy = TransferPolicy(prefix_reuse=reuse, store_turns=reuse, transfer=reuse)
    return Settings(
        data_dir=data_dir,
        engines={MODEL: EngineSettings(model=MODEL, device="cpu")},
        roles={
            "bench": RoleSettings(engine=MODEL, generation=GenerationDefaults(max_tokens=max_tokens), policy=policy)
        },
        auth=AuthSettings(client_keys=[KEY], admin_key=None),  # type: ignore[list-item]
    )


def serve(port: int, data_dir: str, max_tokens: int, reuse: bool) -> None:
    """The child process: the gateway on ``port`` (``python -c`` entry point)."""
    settings = _settings(Path(data_dir), max_tokens, reuse)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(
    *, requests: int = 40, max_tokens: int = 1, reuse: bool = False, asgi: bool = False, zoo: Zoo | None = None
) -> Result:
    engine = LocalEngine.from_zoo(MODEL, zoo=zoo or Zoo(), device="cpu")
    if asgi:
        return asyncio.run(_in_process(engine, requests, max_tokens, reuse))
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        code = f"from bench.gateway_bench import serve; serve({port}, {tmp!r}, {max_tokens}, {reuse})"
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while True:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not start")
                try:
                    if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            return asyncio.run(_measure(engine, url, requests, max_tokens))
        finally:
            child.terminate()
            child.wait(30)
            asyncio.run(engine.aclose())


async def _in_process(engine: LocalEngine, n: int, max_tokens: int, reuse: bool) -> Result:
    """The gateway's own code without sockets or process hops: the ASGI app called in this loop,
    sharing the direct call's engine object."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = _settings(Path(tmp), max_tokens, reuse)
        app = create_app(settings, pool=EnginePool({MODEL: PooledEngine(MODEL, engine, settings.engines[MODEL])}),
                         own_pool=False)  # fmt: skip
        async with app.router.lifespan_context(app):
            try:
                return await _measure(engine, "http://gateway", n, max_tokens, httpx.ASGITransport(app=app))
            finally:
                await engine.aclose()


async def _measure(
    engine: LocalEngine, url: str, n: int, max_tokens: int, transport: httpx.AsyncBaseTransport | None = None
) -> Result:
    params = SamplingParams(max_tokens=max_tokens)
    headers = {"Authorization": f"Bearer {KEY}"}
    result = Result(n, [], [], [], [])
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, transport=transport) as http:

        async def direct(prompt: str) -> tuple[float, float]:
            t0 = time.perf_counter()
            ids = engine.encode(engine.render([{"role": "user", "content": prompt}])).ids
            done = await engine.complete(ids, params)
            wall = (time.perf_counter() - t0) * 1000
            return wall, wall - (done.timings.ttft_ms + done.timings.decode_ms)

        async def gateway(prompt: str) -> tuple[float, float]:
            body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
            t0 = time.perf_counter()
            r = await http.post("/v1/chat/completions", json=body)
            wall = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            return wall, wall - float(r.json()["usage"]["heterofold"]["engine_ms"])

        for prompt in _prompts(4):  # warm both paths: first forwards, connections, imports
            await direct(prompt)
            await gateway(prompt)
        for i, prompt in enumerate(_prompts(n)):
            if i % 2:  # alternate which goes first, so neither always meets a warmer cache
                d, d_out = await direct(prompt)
                g, g_out = await gateway(prompt)
            else:
                g, g_out = await gateway(prompt)
                d, d_out = await direct(prompt)
            result.direct_ms.append(d)
            result.gateway_ms.append(g)
            result.direct_outside_ms.append(d_out)
            result.gateway_outside_ms.append(g_out)
    return result
