"""``heterofold fit`` and ``heterofold eval``: fit an adapter, evaluate every path on the same items."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.app import app
from cli.common import DEFAULT_SELECTOR, DEFAULT_TAIL, SELECTOR_HELP, CacheDir, console, err, errors, progress_bars
from engines.zoo import Zoo


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
    distill_questions: Annotated[
        int, typer.Option(min=1, help="distilled: generic questions per context (different templates first).")
    ] = 1,
    gates: Annotated[
        bool, typer.Option(help="distilled: also learn a per-head temperature and value gain for mapped tokens.")
    ] = False,
    token_residual: Annotated[
        bool,
        typer.Option(help="distilled: also fit the token map's weights (a start fitted with --token-rank)."),
    ] = False,
    distill_path: Annotated[
        str,
        typer.Option(
            help="distilled: the path to fit for: recompute (chosen tokens native in place) or quote "
            "(the whole context mapped, the chosen spans quoted after it, as map_quote hops serve)."
        ),
    ] = "recompute",
    lr: Annotated[float, typer.Option(min=0.0, help="distilled: Adam's learning rate.")] = 2e-3,
    clip: Annotated[
        float | None, typer.Option(min=0.0, help="distilled: the largest gradient norm a step takes (default: none).")
    ] = None,
    token_rank: Annotated[
        int,
        typer.Option(
            min=0,
            help="kv-ridge (and distilled's start): the map also reads the receiver's own embedding of each token "
            "and of the one before it, projected onto this many components (0: off).",
        ),
    ] = 0,
    version: Annotated[str | None, typer.Option(help="Version label (default: method-date).")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Fit an adapter for one direction, both models frozen, and save it."""
    from engines.local import LocalEngine
    from harness.fit_on_engines import default_corpus, distill_direction, fit_direction
    from heterofold.adapter import Adapter
    from heterofold.corpus import corpus_from_file, distill_contexts

    if method not in ("heterofold", "kv-ridge", "distilled"):
        err.print(f"[red]error:[/red] unknown method {method!r}: heterofold, kv-ridge or distilled")
        raise typer.Exit(2)
    if token_rank and method == "heterofold":
        err.print("[red]error:[/red] --token-rank fits a kv-ridge map (or a distilled one's start); heterofold "
                  "calibration does not read token features")  # fmt: skip
        raise typer.Exit(2)
    if token_residual and method != "distilled":
        err.print("[red]error:[/red] --token-residual is a distilled fit's option")
        raise typer.Exit(2)
    if distill_path not in ("recompute", "quote"):
        err.print(f"[red]error:[/red] unknown --distill-path {distill_path!r}: recompute or quote")
        raise typer.Exit(2)
    with errors():
        zoo = Zoo(cache_dir)
        s, r = LocalEngine.from_zoo(sender, zoo=zoo), LocalEngine.from_zoo(receiver, zoo=zoo)
        try:
            texts = corpus_from_file(str(corpus)) if corpus else default_corpus(seed, docs)
        except (OSError, UnicodeDecodeError) as exc:
            err.print(f"[red]error:[/red] cannot read corpus {corpus}: {exc}")
            raise typer.Exit(2) from exc
        label = version or f"{method}-{time.strftime('%Y%m%d-%H%M%S')}"
        fps = {"sender_fingerprint": s.spec.fingerprint, "receiver_fingerprint": r.spec.fingerprint}
        with progress_bars(f"{sender} -> {receiver}") as progress:
            if method == "distilled":
                base = (
                    Adapter.load(start, **fps)
                    if start
                    else asyncio.run(fit_direction(s, r, method="kv-ridge", texts=texts, seed=seed,
                                                   version=f"{label}-start", max_tokens=max_tokens,
                                                   token_rank=token_rank, progress=progress))
                )  # fmt: skip
                if token_residual and base.token is None:
                    err.print("[red]error:[/red] --token-residual fits a token map's weights: start from an adapter "
                              "fitted with --token-rank, or pass --token-rank")  # fmt: skip
                    raise typer.Exit(2)
                contexts = distill_contexts(seed, distill_docs)
                adapter = asyncio.run(
                    distill_direction(s, r, base, contexts=contexts, version=label, seed=seed, steps=steps, rank=rank,
                                      gates=gates, token=token_residual, questions=distill_questions,
                                      path=distill_path, lr=lr, clip=clip,
                                      progress=progress)
                )  # fmt: skip
            else:
                adapter = asyncio.run(
                    fit_direction(s, r, method=method, texts=texts, seed=seed, version=label, max_tokens=max_tokens,
                                  init=init, token_rank=token_rank, progress=progress)
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
            help="Paths to run, comma separated: no_context, sender, quote, recompute_only, NAME, NAME+quote, "
            "NAME+auto (NAME: an adapter's name: heterofold, kv_ridge, or a --map name; +auto: the gateway's "
            "per-hop choice between quote and NAME+quote)."
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
    map_dtype: Annotated[
        str,
        typer.Option(
            help="The map's matmul dtype: host (what the gateway serves here: bfloat16 on CPUs with "
            "AVX512-BF16 and on CUDA, else float32), float32 or bfloat16. Pin it to compare runs across hosts."
        ),
    ] = "host",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = None,
    cache_dir: CacheDir = None,
) -> None:
    """Every path on the same items: native, no_context, sender, quote, recompute_only, and each adapter
    map-only, with recompute, with the spans quoted, and the gateway's auto choice at each budget
    (harness/evaluate.py)."""
    from engines.local import LocalEngine
    from harness.evaluate import PATH_FAMILIES, evaluate, known_paths
    from heterofold.adapter import MAP_DTYPES, Adapter
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
    if map_dtype != "host" and map_dtype not in MAP_DTYPES:
        err.print(f"[red]error:[/red] --map-dtype takes host, float32 or bfloat16, not {map_dtype!r}")
        raise typer.Exit(2)
    if map_dtype != "host":
        os.environ["HETEROFOLD_MAP_DTYPE"] = map_dtype  # read by heterofold.adapter.map_dtype on each apply
    wanted = [p for p in paths.split(",") if p] if paths else None
    known = set(known_paths(folders))
    if wanted and not set(wanted) <= known:
        err.print(f"[red]error:[/red] unknown --paths {sorted(set(wanted) - known)}; known: {sorted(known)}")
        raise typer.Exit(2)
    with errors():
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
        with progress_bars(f"{sender} -> {receiver}") as progress:
            result = asyncio.run(
                evaluate(s, r, items, adapters=maps, served=served, budget=budget, budgets=sweep, paths=wanted,
                         selector=selector, scout=scout, tail=tail, progress=progress)
            )  # fmt: skip
    console.print(eval_table(result, f"{sender} -> {receiver}, {result['items']} items"))
    for path, via in result["auto_via"].items():
        console.print(f"{path}: " + ", ".join(f"{branch} on {n} items" for branch, n in via.items()))
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
