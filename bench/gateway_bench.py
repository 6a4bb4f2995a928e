"""``heterofold bench gateway``: the latency the gateway adds over calling the engine object
directly, in one run, on the same prompts, interleaved.

The gateway runs in this process under uvicorn on loopback with one role on smollm2 and auth on;
the client is httpx. Per prompt, the direct call renders, tokenizes and runs ``engine.complete``
with the same sampling parameters; the gateway call sends the same messages over HTTP. Reported:
p50 of each, and the added latency measured two ways:
- ``added_p50_ms``: p50 of (gateway wall - direct wall), paired per prompt; honest but noisy, since
  the engine's own time (tens to thousands of ms on a shared CPU) varies from call to call;
- ``overhead_p50_ms`` (the target's number): p50 of the paired difference of each side's time
  outside the engine, i.e. wall time minus the engine's own time from submission to the last
  token (the usage block's ``engine_ms`` for the gateway, the Completion's timings for the direct
  call). The direct side's remainder is its render and tokenization; the gateway's adds HTTP, auth,
  validation, the hop decision and the response.
With ``reuse`` the role also looks up and stores KV (the store, the conversation record and the
turn export), as in production; without it the engine call is the very same as the direct one.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
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


def run(*, requests: int = 40, max_tokens: int = 1, reuse: bool = False, zoo: Zoo | None = None) -> Result:
    engine = LocalEngine.from_zoo(MODEL, zoo=zoo or Zoo(), device="cpu")
    policy = TransferPolicy(prefix_reuse=reuse, store_turns=reuse, transfer=reuse)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            engines={MODEL: EngineSettings(model=MODEL)},
            roles={
                "bench": RoleSettings(engine=MODEL, generation=GenerationDefaults(max_tokens=max_tokens), policy=policy)
            },
            auth=AuthSettings(client_keys=[KEY], admin_key=None),  # type: ignore[list-item]
        )
        pool = EnginePool({MODEL: PooledEngine(MODEL, engine, settings.engines[MODEL])})
        app = create_app(settings, pool=pool, own_pool=False)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            return asyncio.run(_measure(engine, f"http://127.0.0.1:{port}", requests, max_tokens))
        finally:
            server.should_exit = True
            thread.join(30)
            asyncio.run(engine.aclose())


async def _measure(engine: LocalEngine, url: str, n: int, max_tokens: int) -> Result:
    params = SamplingParams(max_tokens=max_tokens)
    headers = {"Authorization": f"Bearer {KEY}"}
    result = Result(n, [], [], [], [])
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

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
