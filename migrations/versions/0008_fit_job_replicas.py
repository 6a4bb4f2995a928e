"""fit_jobs across replicas: which replica runs a job, what it fits, and cancel requests

A gateway replica shows and cancels jobs another replica started from the table alone: ``replica``
(host:pid of the gateway that runs it), the job's ``version``, ``docs``, ``max_tokens`` and
``activate``, and ``cancel_requested`` (set by any replica, read by the running one). Rows from
before this revision get empty values and no cancel request.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("replica", "version", "docs", "max_tokens", "activate", "cancel_requested")


def upgrade() -> None:
    op.add_column("fit_jobs", sa.Column("replica", sa.String(200), nullable=False, server_default=""))
    op.add_column("fit_jobs", sa.Column("version", sa.String(200), nullable=False, server_default=""))
    op.add_column("fit_jobs", sa.Column("docs", sa.Integer, nullable=False, server_default="0"))
    op.add_column("fit_jobs", sa.Column("max_tokens", sa.Integer, nullable=False, server_default="0"))
    op.add_column("fit_jobs", sa.Column("activate", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("fit_jobs", sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("fit_jobs") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
