"""The README's main job, ``heterofold run``, stopped by Ctrl-C while its bootstrap fits run: it
must shut down through the app's lifespan (the fits end as stopped, never left ``running`` in the
registry), say what the fits came to, and exit 0 without a traceback."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.conftest import GEMMA, SMOL
from tests.reliability.conftest import free_port

pytestmark = pytest.mark.models


def test_ctrl_c_during_the_bootstrap_fits_stops_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "heterofold.yaml"
    engines = {name: {"model": name, "max_prompt_tokens": 1024, "max_tokens": 16} for name in (SMOL, GEMMA)}
    roles = {"planner": {"engine": SMOL}, "summarizer": {"engine": GEMMA}}
    config.write_text(yaml.safe_dump({"engines": engines, "roles": roles}))
    port = free_port()
    env = {**os.environ, "HETEROFOLD_DATA_DIR": str(tmp_path / "data"), "HETEROFOLD_PORT": str(port)}
    env.pop("HETEROFOLD_CONFIG", None)
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while "Fitting 2 adapter directions" not in log.read_text():  # ready, and the fits started
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            assert httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=10).status_code == 200
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    said = log.read_text()
    assert rc == 0, said[-3000:]
    assert "Traceback" not in said and "CancelledError" not in said, said[-3000:]
    assert "lease" not in said.lower(), said[-3000:]  # the store closed before the embedded Redis stopped
    flat = " ".join(said.split())  # the console wraps long lines at 160 columns
    assert "Then 2 more fits in shadow (distilled;" in flat, said[-3000:]  # the default bootstrap.then
    assert ("0 of 2 adapters fitted and active; 0 of 2 distilled fits in shadow (each replaces the active version "
            "if it beats it on live requests); 4 not finished.") in flat, said[-3000:]  # fmt: skip
    assert said.rstrip().endswith("Stopped."), said[-3000:]
    with sqlite3.connect(tmp_path / "data" / "registry.db") as db:
        rows = db.execute("SELECT method, shadow, status, error FROM fit_jobs ORDER BY method").fetchall()
    stopped = ("failed", "FitCancelled: the gateway is stopping")  # claimable by the next start
    assert rows == [("distilled", 1, *stopped)] * 2 + [("kv-ridge", 0, *stopped)] * 2
