"""Alembic on SQLite and PostgreSQL: upgrade, downgrade to nothing, upgrade again; a column added to
a table that has rows."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import create_engine, inspect, text

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


def test_0007_gives_existing_fit_jobs_zero_attempts_and_downgrades_cleanly(database_url: str) -> None:
    db.upgrade(database_url, "0006")
    engine = create_engine(db.normalize_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO fit_jobs (id, sender_name, receiver_name, method, status, stage, done, total, created_at, "
                "updated_at) VALUES ('j1', 'a', 'b', 'kv-ridge', 'done', '', 1, 1, :now, :now)"
            ), {"now": datetime.now(UTC)})  # fmt: skip
        db.upgrade(database_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT attempts FROM fit_jobs WHERE id = 'j1'")).scalar_one() == 0
        db.downgrade(database_url, "0006")
        assert "attempts" not in {c["name"] for c in inspect(engine).get_columns("fit_jobs")}
    finally:
        engine.dispose()


def test_0008_gives_existing_fit_jobs_no_replica_and_no_cancel_request_and_downgrades_cleanly(
    database_url: str,
) -> None:
    db.upgrade(database_url, "0007")
    engine = create_engine(db.normalize_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO fit_jobs (id, sender_name, receiver_name, method, status, stage, done, total, attempts, "
                "created_at, updated_at) VALUES ('j1', 'a', 'b', 'kv-ridge', 'running', 'fit', 1, 2, 1, :now, :now)"
            ), {"now": datetime.now(UTC)})  # fmt: skip
        db.upgrade(database_url)
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT replica, version, docs, max_tokens, activate, cancel_requested FROM fit_jobs WHERE id = 'j1'"
            )).one()  # fmt: skip
        assert tuple(row) == ("", "", 0, 0, False, False)
        with engine.begin() as conn:  # the new columns take values: a cancel request on another replica's job
            conn.execute(text("UPDATE fit_jobs SET replica = 'host-a:1', cancel_requested = :yes WHERE id = 'j1'"),
                         {"yes": True})  # fmt: skip
        db.downgrade(database_url, "0007")
        columns = {c["name"] for c in inspect(engine).get_columns("fit_jobs")}
        assert columns.isdisjoint({"replica", "version", "docs", "max_tokens", "activate", "cancel_requested"})
        assert "attempts" in columns
        with engine.connect() as conn:  # the rows survive the table's rebuild on SQLite
            assert conn.execute(text("SELECT attempts FROM fit_jobs WHERE id = 'j1'")).scalar_one() == 1
        db.upgrade(database_url)
        assert {"replica", "cancel_requested"} <= {c["name"] for c in inspect(engine).get_columns("fit_jobs")}
    finally:
        engine.dispose()


def test_0009_leaves_existing_samples_unpaired_and_jobs_out_of_shadow_and_downgrades_cleanly(database_url: str) -> None:
    db.upgrade(database_url, "0008")
    engine = create_engine(db.normalize_url(database_url))
    now = {"now": datetime.now(UTC)}
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO adapter_versions (id, sender_name, receiver_name, sender_fingerprint, "
                "receiver_fingerprint, version, method, status, artifact_path, sha256, metrics, created_at, "
                "updated_at) VALUES (1, 'a', 'b', 'fa', 'fb', 'v1', 'kv-ridge', 'shadow', '/x', 'ff', '{}', :now, :now)"
            ), now)  # fmt: skip
            conn.execute(text("INSERT INTO shadow_samples (adapter_id, first_token_kl, top1_agreement, at) "
                              "VALUES (1, 0.25, 0.5, :now)"), now)  # fmt: skip
            conn.execute(text(
                "INSERT INTO fit_jobs (id, sender_name, receiver_name, method, status, stage, done, total, created_at, "
                "updated_at) VALUES ('j1', 'a', 'b', 'kv-ridge', 'done', '', 1, 1, :now, :now)"
            ), now)  # fmt: skip
        db.upgrade(database_url)
        with engine.connect() as conn:
            sample = conn.execute(
                text("SELECT first_token_kl, answer_kl, baseline_id, baseline_kl FROM shadow_samples")
            )
            assert tuple(sample.one()) == (0.25, None, None, None)
            assert conn.execute(text("SELECT shadow FROM fit_jobs WHERE id = 'j1'")).scalar_one() in (False, 0)
        db.downgrade(database_url, "0008")
        assert "baseline_kl" not in {c["name"] for c in inspect(engine).get_columns("shadow_samples")}
        assert "shadow" not in {c["name"] for c in inspect(engine).get_columns("fit_jobs")}
        with engine.connect() as conn:  # the rows survive the tables' rebuild on SQLite
            assert conn.execute(text("SELECT first_token_kl FROM shadow_samples")).scalar_one() == 0.25
    finally:
        engine.dispose()
