"""Alembic migrations of the registry (``gateway.registry.tables``). Run with ``heterofold db upgrade``."""
