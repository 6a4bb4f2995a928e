"""The SQL registry: models with their fingerprints, adapter versions per ordered pair, the audit
log, fit jobs and shadow samples. SQLAlchemy 2; the schema is made by Alembic (``migrations/``)."""
