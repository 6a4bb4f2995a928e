"""``python -m cli``: the ``heterofold`` command line."""

from cli import app

app()
