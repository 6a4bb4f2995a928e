"""Fixtures of the SGLang tests: a real Redis for the page store, and SGLang's own storage modules
from the pinned wheel (downloaded once with ``pip download --no-deps``, never installed)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from store.hicache import SGLANG_VERSION
from store.redis_server import EmbeddedRedis

# The storage modules import only torch and the standard library (sglang/srt/environ.py included).
_MODULES = (
    "sglang/srt/environ.py",
    "sglang/srt/mem_cache/hicache_storage.py",
    "sglang/srt/mem_cache/storage/__init__.py",
    "sglang/srt/mem_cache/storage/backend_factory.py",
)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("hicache-redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


def _sglang_source() -> Path:
    """The pinned wheel's storage modules, extracted under the cache directory."""
    cache = Path(os.environ.get("HETEROFOLD_CACHE_DIR", Path.home() / ".cache" / "heterofold"))
    root = cache / f"sglang-{SGLANG_VERSION}-src"
    if all((root / m).is_file() for m in _MODULES):
        return root
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            f"sglang=={SGLANG_VERSION}",
            "-d",
            str(wheels),
        ]
        subprocess.run(cmd, check=True, timeout=600)
        found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        for m in _MODULES:
            wheel.extract(m, root)
    return root


@pytest.fixture
def real_sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """SGLang's ``hicache_storage`` and ``storage`` (its backend factory), imported from the wheel
    under a bare ``sglang`` package (its real ``__init__`` pulls in CUDA), and our backend module
    reloaded on top of them. Both are undone afterwards."""
    root = _sglang_source()
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    package = types.ModuleType("sglang")
    package.__path__ = [str(root / "sglang")]
    monkeypatch.setitem(sys.modules, "sglang", package)
    storage = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    factory = importlib.import_module("sglang.srt.mem_cache.storage")
    import store.hicache.backend as backend

    importlib.reload(backend)
    yield types.SimpleNamespace(storage=storage, factory=factory, backend=backend)
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        sys.modules.pop(name, None)
    monkeypatch.undo()
    importlib.reload(backend)
