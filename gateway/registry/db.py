"""The registry's database: one SQLAlchemy engine and session factory, and Alembic to head.

SQLite by default (a file under the data directory), PostgreSQL by URL
(``postgresql+psycopg://user@host/db``; a bare ``postgresql://`` URL is taken to mean psycopg 3).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

import migrations
from gateway.errors import RegistryError

MIGRATIONS_DIR = Path(migrations.__file__).parent


def normalize_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    _ensure_sqlite_dir(url)
    with start_lock(url):
        command.upgrade(alembic_config(url), revision)


# Any 64-bit number that names this lock on the server: replicas starting together migrate in turn.
_PG_LOCK = 0x4846_4D49_4752_4154  # "HFMIGRAT"


@contextmanager
def start_lock(url: str) -> Iterator[None]:
    """Held while one gateway migrates the registry and registers its models, so that replicas
    starting at once on one database do it in turn rather than racing on ``CREATE TABLE``: a
    PostgreSQL advisory lock (on a connection of its own), or for SQLite a file lock next to the
    database file. Not re-entrant: ``upgrade`` takes it, so never call that inside it."""
    u = make_url(normalize_url(url))
    if u.get_backend_name() == "postgresql":
        engine = create_engine(normalize_url(url), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK})
        finally:
            engine.dispose()
    elif u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        with open(f"{u.database}.start.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    else:
        yield


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def _ensure_sqlite_dir(url: str) -> None:
    u = make_url(normalize_url(url))
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    with suppress(OSError):  # a folder that cannot be made yet: the first session fails, not the start
        _ensure_sqlite_dir(url)
    if make_url(url).get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # pysqlite must not begin transactions itself
            dbapi_conn.execute("PRAGMA foreign_keys=ON")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

        @event.listens_for(engine, "begin")
        def _immediate(conn):  # type: ignore[no-untyped-def]
            # Writers take the lock when their transaction begins: a promotion reads the pair and
            # writes it in one serialized step, as SELECT ... FOR UPDATE does on PostgreSQL.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


class Database:
    """The registry's engine and sessions. Every failure leaves as ``RegistryError``."""

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back on error."""
        try:
            with self._sessions() as session, session.begin():
                yield session
        except SQLAlchemyError as exc:
            raise RegistryError(f"registry: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc

    def ping(self) -> None:
        with self.session() as session:
            session.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()
