"""Alembic on SQLite and PostgreSQL: upgrade, downgrade to nothing, upgrade again."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect

from gateway.registry import db

TABLES = {"models", "adapter_versions", "audit_log", "fit_jobs", "shadow_samples", "request_log"}


def tables(url: str) -> set[str]:
    engine = create_engine(db.normalize_url(url))
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    db.upgrade(database_url)
    assert tables(database_url) == TABLES
    db.downgrade(database_url, "base")
    assert tables(database_url) == set()
    db.upgrade(database_url)
    assert tables(database_url) == TABLES


def test_each_revision_downgrades_what_it_upgraded(database_url: str) -> None:
    db.upgrade(database_url, "0002")
    assert tables(database_url) == {"models", "adapter_versions"}
    db.downgrade(database_url, "0001")
    assert tables(database_url) == {"models"}
    db.upgrade(database_url)
    assert tables(database_url) == TABLES
