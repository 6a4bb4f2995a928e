"""request_log: one row per answered chat request (route, path, TTFT, prefill saved)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("role", sa.String(200), nullable=False),
        sa.Column("sender", sa.String(200), nullable=True),
        sa.Column("receiver", sa.String(200), nullable=False),
        sa.Column("path", sa.String(20), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("transferred_tokens", sa.Integer, nullable=False),
        sa.Column("ttft_ms", sa.Float, nullable=False),
        sa.Column("transfer_ms", sa.Float, nullable=False),
        sa.Column("prefill_ms_saved", sa.Float, nullable=False),
        sa.Column("adapter_version", sa.String(200), nullable=True),
    )
    op.create_index("ix_request_log_at", "request_log", ["at"])


def downgrade() -> None:
    op.drop_index("ix_request_log_at", table_name="request_log")
    op.drop_table("request_log")
