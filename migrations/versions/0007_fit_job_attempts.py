"""fit_jobs.attempts: how many times a job's fit was started (retries included)

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("fit_jobs", sa.Column("attempts", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("fit_jobs") as batch:
        batch.drop_column("attempts")
