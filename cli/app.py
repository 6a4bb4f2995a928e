"""The ``heterofold`` Typer application; the command modules register on it (``cli/__init__.py``)."""

from __future__ import annotations

import typer

app = typer.Typer(help="HeteroFold Gateway: carry KV caches across model families.", no_args_is_help=True)
