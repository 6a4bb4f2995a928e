"""Progress on long commands when the output is a log, not a terminal: plain lines, throttled."""

import io

import pytest
from rich.console import Console

from cli import common


def test_progress_prints_plain_lines_to_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=out, force_terminal=False, width=160))
    clock = iter([0.0, 1.0, 2.0, 7.0, 8.0, 9.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    with common.progress_bars("a -> b") as update:
        for done in range(1, 6):
            update("fit", done, 5)  # at t = 0, 1, 2, 7, 8
    lines = out.getvalue().splitlines()
    assert lines == ["a -> b: fit layers 1/5 (0 s)", "a -> b: fit layers 4/5 (7 s)", "a -> b: fit layers 5/5 (8 s)"]
