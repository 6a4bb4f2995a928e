"""The registry's adapter lifecycle on SQLite and PostgreSQL: atomic promotion, rollback,
retirement, the audit log, and one active version per pair held by the database itself."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, update

from gateway.errors import Conflict, RegistryError
from gateway.registry import db as registry_db
from gateway.registry import versions
from gateway.registry.db import Database
from gateway.registry.tables import AdapterRow

S, R = "1" * 64, "2" * 64


@pytest.fixture
def database(database_url: str) -> Database:
    registry_db.upgrade(database_url)
    d = Database(database_url)
    yield d  # type: ignore[misc]
    d.close()


def add(database: Database, version: str, sender: str = S) -> int:
    with database.session() as s:
        return versions.create_adapter(
            session=s, sender_name="a", receiver_name="b", sender_fingerprint=sender, receiver_fingerprint=R,
            version=version, method="heterofold", artifact_path="/x", sha256="0" * 64, metrics={}, actor="test",
        ).id  # fmt: skip


def statuses(database: Database) -> dict[int, str]:
    with database.session() as s:
        return {r.id: r.status for r in versions.list_adapters(session=s)}


def test_promote_demotes_the_previous_active_version(database: Database) -> None:
    v1, v2, other = add(database, "v1"), add(database, "v2"), add(database, "v1", sender="3" * 64)
    with database.session() as s:
        versions.promote(session=s, adapter_id=v1, actor="admin")
        versions.promote(session=s, adapter_id=other, actor="admin")
    with database.session() as s:
        versions.promote(session=s, adapter_id=v2, actor="admin")
    assert statuses(database) == {v1: "candidate", v2: "active", other: "active"}
    with database.session() as s:
        log = [(r.adapter_id, r.action, r.from_status, r.to_status) for r in versions.audit_log(session=s)][:2]
    assert log == [(v2, "promote", "candidate", "active"), (v1, "demote", "active", "candidate")]


def test_rollback_restores_the_version_it_replaced(database: Database) -> None:
    v1, v2 = add(database, "v1"), add(database, "v2")
    for v in (v1, v2):
        with database.session() as s:
            versions.promote(session=s, adapter_id=v, actor="admin")
    with database.session() as s:
        restored = versions.rollback(session=s, adapter_id=v2, actor="admin", reason="drift")
    assert restored.id == v1 and statuses(database) == {v1: "active", v2: "candidate"}
    with database.session() as s, pytest.raises(Conflict):
        versions.rollback(session=s, adapter_id=v1, actor="admin")  # v1 replaced nothing
    assert statuses(database) == {v1: "active", v2: "candidate"}


def test_retired_versions_cannot_serve_again(database: Database) -> None:
    v1 = add(database, "v1")
    with database.session() as s:
        versions.retire(session=s, adapter_id=v1, actor="admin")
    with database.session() as s, pytest.raises(Conflict):
        versions.promote(session=s, adapter_id=v1, actor="admin")
    assert statuses(database) == {v1: "retired"}


def test_the_database_refuses_a_second_active_version_for_a_pair(database: Database) -> None:
    v1, v2 = add(database, "v1"), add(database, "v2")
    with database.session() as s:
        versions.promote(session=s, adapter_id=v1, actor="admin")
    with pytest.raises(RegistryError), database.session() as s:
        s.execute(update(AdapterRow).where(AdapterRow.id == v2).values(status="active"))
    assert statuses(database) == {v1: "active", v2: "candidate"}


def test_concurrent_promotions_leave_exactly_one_active_version(database: Database) -> None:
    ids = [add(database, f"v{i}") for i in range(6)]
    errors: list[Exception] = []

    def promote(v: int) -> None:
        try:
            with database.session() as s:
                versions.promote(session=s, adapter_id=v, actor="admin")
        except RegistryError as exc:  # a serialization failure is allowed; two actives are not
            errors.append(exc)

    threads = [threading.Thread(target=promote, args=(v,)) for v in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with database.session() as s:
        active = s.scalar(select(func.count()).where(AdapterRow.status == "active"))
        promotions = [r for r in versions.audit_log(session=s) if r.action == "promote"]
    assert active == 1 and len(promotions) == len(ids) - len(errors)
