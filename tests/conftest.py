"""Shared fixtures. Models come through the zoo: a fresh machine fetches and converts them on
first use (into HETEROFOLD_CACHE_DIR or ~/.cache/heterofold), later runs load them in seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from engines.catalog import CATALOG
from engines.local import LocalEngine
from engines.zoo import Zoo

MODELS = tuple(CATALOG)


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return Zoo()


@pytest.fixture(scope="session")
def load_engine(zoo: Zoo) -> Iterator[Callable[[str], LocalEngine]]:
    """Loads each model once per session, on CPU so results do not depend on the machine."""
    loaded: dict[str, LocalEngine] = {}

    def get(name: str) -> LocalEngine:
        if name not in loaded:
            loaded[name] = LocalEngine.from_zoo(name, zoo=zoo, device="cpu")
        return loaded[name]

    yield get
    for engine in loaded.values():
        asyncio.run(engine.aclose())


@pytest.fixture(params=MODELS, scope="session")
def engine(request: pytest.FixtureRequest, load_engine: Callable[[str], LocalEngine]) -> LocalEngine:
    return load_engine(request.param)
