"""The ``heterofold`` command line.

heterofold models list                 the zoo: family, shapes, cache state
heterofold models pull [NAME|all]      fetch, verify and convert, with progress bars
heterofold models check [NAME|all]     exact KV export/import check; exit 1 if any fails
heterofold chat MODEL MESSAGE          stream one reply from the embedded engine
heterofold run                         the main job: the gateway on embedded defaults (see ``run``)
heterofold serve [--config FILE]       the gateway as configured (YAML plus HETEROFOLD_* environment)
heterofold demo [--url URL]            planner -> executor -> summarizer over HTTP, per-hop paths and savings
heterofold fit | eval                  fit an adapter; evaluate every path on the same items
heterofold bench store|selectors|transfer|gateway|load   benchmarks (bench/cli.py)
heterofold db upgrade|downgrade        the registry's Alembic migrations

One module per command group (``cli/models.py``, ``cli/method.py``, ``cli/serve.py``); the
benchmarks register their own group (``bench/cli.py``).
"""

from __future__ import annotations

from bench.cli import bench_app
from cli import method, models, serve  # noqa: F401  (register their commands)
from cli.app import app

app.add_typer(bench_app, name="bench")

__all__ = ["app"]
