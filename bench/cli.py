"""``heterofold bench ...``: the benchmarks' commands, registered by the benchmarks themselves
(``cli/__init__.py`` mounts ``bench_app``); nothing in the product packages imports ``bench``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import DEFAULT_SELECTOR, SELECTOR_HELP, CacheDir, console, err, errors, progress_bars
from engines.zoo import Zoo

bench_app = typer.Typer(help="Benchmarks: same-run ratios.", no_args_is_help=True)


@bench_app.command("store")
def bench_store(
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    tokens: Annotated[int, typer.Option(min=16, help="Tokens of the synthetic smollm2-shaped KV value.")] = 2048,
    repeats: Annotated[int, typer.Option(min=1)] = 10,
    lookups: Annotated[int, typer.Option(min=100)] = 2000,
    fsync: Annotated[bool, typer.Option(help="fsync writes, read cold: the disk, not the page cache.")] = False,
    redis_url: Annotated[str | None, typer.Option(help="Redis for the lookups (default: embedded).")] = None,
) -> None:
    """CPU and SSD tier bandwidth against memcpy and plain file I/O, and index lookup latency."""
    from bench.store_bench import report
    from bench.store_bench import run as run_bench
    from store.errors import StoreError

    try:
        result = run_bench(tokens=tokens, repeats=repeats, lookups=lookups, redis_url=redis_url, fsync=fsync)
    except StoreError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    print(json.dumps(result.to_json(), indent=2) if json_out else report(result))


@bench_app.command("selectors")
def bench_selectors(
    sender: Annotated[str, typer.Option(help="Sender zoo model.")],
    receiver: Annotated[str, typer.Option(help="Receiver zoo model.")],
    data: Annotated[str, typer.Option(help="JSONL file of {id, context, question, answer}, or `builtin`.")] = "builtin",
    lengths: Annotated[str, typer.Option(help="Builtin suite context lengths, comma separated.")] = "1024",
    kinds: Annotated[str, typer.Option(help="Builtin suite kinds, comma separated.")] = (
        "passkey,multikey,facts,handoff,paraphrase,update,chain"
    ),
    per_cell: Annotated[int, typer.Option(min=1, help="Builtin items per (kind, length, variant).")] = 1,
    adapter: Annotated[
        Path | None, typer.Option(help="Adapter whose map receiver-attention reads (default: S__R/kv-ridge if fitted).")
    ] = None,
    scout: Annotated[bool, typer.Option(help="Also run the scout selector (loads the scout model).")] = True,
    budgets: Annotated[str, typer.Option(help="Budgets, comma separated.")] = "0.01,0.02,0.05",
    quote_budget: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Budget of the quote accuracy (0: skip).")
    ] = 0.02,
    quote_selectors: Annotated[
        str, typer.Option(help="Selectors whose choice is quoted for accuracy, comma separated (default: all).")
    ] = "",
    native: Annotated[bool, typer.Option(help="Also measure the receiver's native accuracy.")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Answer recall of every selector at each budget on the same items, its time, and quote accuracy."""
    from bench.selectors import compare, markdown
    from engines.local import LocalEngine
    from engines.selectors import SCOUT
    from heterofold.adapter import Adapter
    from heterofold.suite import builtin_suite
    from heterofold.tasks import load_jsonl

    with errors():
        if data == "builtin":
            items = builtin_suite(lengths=tuple(int(x) for x in lengths.split(",")), per_cell=per_cell,
                                  kinds=tuple(k for k in kinds.split(",") if k))  # fmt: skip
        else:
            items = load_jsonl(data)
        zoo = Zoo(cache_dir)
        s, r = LocalEngine.from_zoo(sender, zoo=zoo), LocalEngine.from_zoo(receiver, zoo=zoo)
        loaded = {sender: s, receiver: r}
        reader = (loaded.get(SCOUT) or LocalEngine.from_zoo(SCOUT, zoo=zoo)) if scout else None
        folder = adapter or Path("artifacts/adapters") / f"{sender}__{receiver}" / "kv-ridge"
        fps = {"sender_fingerprint": s.spec.fingerprint, "receiver_fingerprint": r.spec.fingerprint}
        mapped = Adapter.load(folder, **fps) if adapter or folder.exists() else None
        with progress_bars(f"{sender} -> {receiver}") as progress:
            result = asyncio.run(
                compare(s, r, items, adapter=mapped, scout=reader, budgets=[float(b) for b in budgets.split(",")],
                        quote_budget=quote_budget or None,
                        quote_selectors=[q for q in quote_selectors.split(",") if q] or None, native=native,
                        progress=progress)
            )  # fmt: skip
    console.print(markdown(result))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {json_out}")


@bench_app.command("transfer")
def bench_transfer(
    sender: Annotated[str, typer.Option(help="Sender zoo model.")],
    receiver: Annotated[str, typer.Option(help="Receiver zoo model.")],
    context: Annotated[int, typer.Option(min=256, help="Context length in tokens (about).")] = 4096,
    adapter: Annotated[
        Path | None, typer.Option(help="HeteroFold adapter (default: artifacts/adapters/S__R/heterofold).")
    ] = None,
    ridge: Annotated[
        Path | None, typer.Option(help="KV Ridge adapter (default: artifacts/adapters/S__R/kv-ridge).")
    ] = None,
    budget: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="HeteroFold recompute budget (BENCHMARKS.md recommends 0.02).")
    ] = 0.02,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    selector: Annotated[str, typer.Option(help=SELECTOR_HELP)] = DEFAULT_SELECTOR,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Median TTFT: native prefill vs HeteroFold vs KV Ridge, and the transfer vs the memory floor."""
    from bench.transfer_bench import run_bench
    from engines.local import LocalEngine
    from heterofold.adapter import Adapter

    base = Path("artifacts/adapters") / f"{sender}__{receiver}"
    with errors():
        zoo = Zoo(cache_dir)
        s, r = LocalEngine.from_zoo(sender, zoo=zoo), LocalEngine.from_zoo(receiver, zoo=zoo)
        fps = {"sender_fingerprint": s.spec.fingerprint, "receiver_fingerprint": r.spec.fingerprint}
        hf = Adapter.load(adapter or base / "heterofold", **fps)
        ridge_dir = ridge or base / "kv-ridge"
        kr = Adapter.load(ridge_dir, **fps) if ridge or ridge_dir.exists() else None
        result = run_bench(s, r, context=context, heterofold=hf, kv_ridge=kr, budget=budget, repeats=repeats,
                           selector=selector)  # fmt: skip
    console.print(json.dumps(result, indent=2))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2))


@bench_app.command("gateway")
def bench_gateway(
    requests: Annotated[int, typer.Option(min=5)] = 40,
    max_tokens: Annotated[int, typer.Option(min=1)] = 1,
    reuse: Annotated[bool, typer.Option(help="Also look up and store KV, as in production.")] = False,
    asgi: Annotated[bool, typer.Option(help="Call the app in-process (no sockets) instead of a child server.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    cache_dir: CacheDir = None,
) -> None:
    """Per-request latency the gateway adds over calling the engine object directly (same run, same prompts)."""
    from bench.gateway_bench import run as run_bench

    with errors():
        result = run_bench(requests=requests, max_tokens=max_tokens, reuse=reuse, asgi=asgi, zoo=Zoo(cache_dir))
    summary = result.summary()
    if json_out:
        print(json.dumps(summary, indent=2))
        return
    verdict = "met" if summary["overhead_p50_ms"] <= summary["target_p50_ms"] else "missed"
    console.print(
        f"{summary['requests']} requests, smollm2, max_tokens {max_tokens}, reuse {reuse}, "
        f"{'in-process ASGI' if asgi else 'HTTP to a child process'}: direct p50 "
        f"{summary['direct_p50_ms']} ms, gateway p50 {summary['gateway_p50_ms']} ms, paired wall difference p50 "
        f"{summary['added_p50_ms']} ms; time outside the engine p50: direct {summary['direct_outside_engine_p50_ms']}"
        f" ms, gateway {summary['gateway_outside_engine_p50_ms']} ms; gateway-added latency p50 "
        f"{summary['overhead_p50_ms']} ms (p90 {summary['overhead_p90_ms']}); target p50 <= "
        f"{summary['target_p50_ms']} ms: {verdict}"
    )


@bench_app.command("load")
def bench_load(
    minutes: Annotated[float, typer.Option(min=0.1)] = 3.0,
    conversations: Annotated[int, typer.Option(min=1)] = 4,
    hops: Annotated[int, typer.Option(min=1)] = 5,
    adapter: Annotated[list[Path] | None, typer.Option(help="Fitted artifact to upload and promote first.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report here.")] = None,
) -> None:
    """Bounded load: concurrent multi-hop conversations across every role (bench/load.py)."""
    from bench.load import main as load_main

    args = ["--minutes", str(minutes), "--conversations", str(conversations), "--hops", str(hops)]
    args += [a for folder in adapter or [] for a in ("--adapter", str(folder))]
    with errors():
        load_main(args + (["--json", str(json_out)] if json_out else []))
