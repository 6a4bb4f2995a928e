"""audit_log: every promotion, rollback, retirement and status change

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=False),
        sa.Column("action", sa.String(30), nullable=False),
        sa.Column("from_status", sa.String(20), nullable=True),
        sa.Column("to_status", sa.String(20), nullable=False),
        sa.Column("actor", sa.String(50), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_audit_log_adapter_id", "audit_log", ["adapter_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_adapter_id", table_name="audit_log")
    op.drop_table("audit_log")
