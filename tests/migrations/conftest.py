"""Databases for registry tests: SQLite in a temporary folder, and PostgreSQL in a schema made for
the test and dropped afterwards (``HETEROFOLD_TEST_POSTGRES_URL``, default the local server)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

POSTGRES = os.environ.get("HETEROFOLD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    schema = f"hf_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES}: {exc.orig}")
    sep = "&" if "?" in POSTGRES else "?"
    yield f"{POSTGRES}{sep}options={quote(f'-csearch_path={schema}')}"
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
