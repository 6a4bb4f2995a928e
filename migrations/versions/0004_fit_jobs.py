"""fit_jobs: adapter fits started from the admin API, with their progress

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fit_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("sender_name", sa.String(200), nullable=False),
        sa.Column("receiver_name", sa.String(200), nullable=False),
        sa.Column("method", sa.String(50), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("stage", sa.String(50), nullable=False),
        sa.Column("done", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fit_jobs")
