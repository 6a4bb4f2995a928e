"""``heterofold chat|run|serve|demo|db``: the engine and the gateway."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.app import app
from cli.common import CacheDir, console, errors
from cli.models import models_pull
from engines.zoo import Zoo


@app.command()
def chat(
    model: Annotated[str, typer.Argument(help="A zoo model name.")],
    message: Annotated[str, typer.Argument(help="The user message.")],
    system: Annotated[str | None, typer.Option(help="A system message.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 64,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.0,
    seed: Annotated[int | None, typer.Option()] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Stream one reply from the embedded engine, then print its timings."""
    with errors():
        asyncio.run(_chat(model, message, system, max_tokens, temperature, seed, Zoo(cache_dir)))


async def _chat(
    model: str, message: str, system: str | None, max_tokens: int, temperature: float, seed: int | None, zoo: Zoo
) -> None:
    from engines.base import Completion, SamplingParams
    from engines.local import LocalEngine

    engine = LocalEngine.from_zoo(model, zoo=zoo)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    ids = engine.encode(engine.render(messages)).ids
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    console.print(f"[bold]{model}[/bold] ({engine.spec.family}, loaded in {engine.load_s:.1f} s):")
    async for event in engine.stream(ids, params):
        if isinstance(event, Completion):
            t = event.timings
            console.print(
                f"\n[dim]{t.prompt_tokens} prompt tokens | prefill {t.prefill_ms:.0f} ms | TTFT {t.ttft_ms:.0f} ms | "
                f"{t.completion_tokens} tokens at {t.decode_tokens_per_s:.1f} tokens/s | {event.finish_reason}[/dim]"
            )
        else:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    await engine.aclose()


@app.command()
def run(
    cache_dir: CacheDir = None,
    config: Annotated[Path | None, typer.Option("--config", envvar="HETEROFOLD_CONFIG", help="YAML config.")] = None,
) -> None:
    """The main job: pull the zoo, then start the gateway on embedded defaults (local engines,
    embedded Redis, SQLite), fit missing adapters in the background, and print the URLs."""
    from cli.gateway import run_main

    models_pull("all", cache_dir)
    with errors():
        run_main(config)


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option("--config", envvar="HETEROFOLD_CONFIG", help="YAML config.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Run the gateway with uvicorn, as configured."""
    from cli.gateway import serve as serve_gateway

    with errors():
        serve_gateway(config, host, port)


@app.command()
def demo(
    url: Annotated[str, typer.Option(help="A running gateway (`heterofold run`).")] = "http://127.0.0.1:8000",
    key: Annotated[
        str | None, typer.Option(envvar="HETEROFOLD_API_KEY", help="Client key, if the API needs one.")
    ] = None,
    context_chars: Annotated[int, typer.Option(min=500, help="Characters of shared context.")] = 6000,
    max_tokens: Annotated[int, typer.Option(min=1)] = 48,
    compare: Annotated[bool, typer.Option(help="Also time each hop prefilled natively.")] = True,
) -> None:
    """Drive planner -> executor -> summarizer over HTTP on a long shared context; print each hop."""
    from gateway.demo import run_demo

    hops = run_demo(url, key, context_chars=context_chars, max_tokens=max_tokens, compare=compare)
    table = Table(title=f"multi-agent demo against {url}")
    cols = ("hop", "model", "path", "adapter", "prompt tok", "cached", "transferred", "recomputed", "transfer ms",
            "TTFT ms", "native TTFT ms", "prefill saved ms", "fallback")  # fmt: skip
    for col in cols:
        table.add_column(col)
    for h in hops:
        u, hf = h.usage, h.usage["heterofold"]
        table.add_row(
            h.role, h.model, hf["path"], str(hf["adapter_version"] or ""), str(u["prompt_tokens"]),
            str(u["prompt_tokens_details"]["cached_tokens"]), str(hf["tokens_transferred"]),
            str(hf["tokens_recomputed"]), f"{hf['transfer_ms']:.0f}", f"{hf['ttft_ms']:.0f}",
            f"{h.native_ttft_ms:.0f}" if h.native_ttft_ms is not None else "", f"{hf['prefill_ms_saved']:.0f}",
            str(hf["fallback"] or ""),
        )  # fmt: skip
    console.print(table)
    for h in hops:
        console.print(f"[bold]{h.role}[/bold]: {h.text.strip()[:300]}")


def _register_db() -> None:
    from cli.gateway import db_app

    app.add_typer(db_app, name="db")


_register_db()
