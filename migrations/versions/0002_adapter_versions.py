"""adapter_versions: per ordered pair, with status and at most one active version

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ACTIVE = sa.text("status = 'active'")


def upgrade() -> None:
    op.create_table(
        "adapter_versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("sender_name", sa.String(200), nullable=False),
        sa.Column("receiver_name", sa.String(200), nullable=False),
        sa.Column("sender_fingerprint", sa.String(64), nullable=False),
        sa.Column("receiver_fingerprint", sa.String(64), nullable=False),
        sa.Column("version", sa.String(200), nullable=False),
        sa.Column("method", sa.String(50), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("artifact_path", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('candidate', 'shadow', 'active', 'retired')", name="ck_adapter_status"),
    )
    op.create_index(
        "uq_adapter_versions_pair_version",
        "adapter_versions",
        ["sender_fingerprint", "receiver_fingerprint", "version"],
        unique=True,
    )
    op.create_index(
        "uq_adapter_versions_one_active",
        "adapter_versions",
        ["sender_fingerprint", "receiver_fingerprint"],
        unique=True,
        sqlite_where=ACTIVE,
        postgresql_where=ACTIVE,
    )


def downgrade() -> None:
    op.drop_index("uq_adapter_versions_one_active", table_name="adapter_versions")
    op.drop_index("uq_adapter_versions_pair_version", table_name="adapter_versions")
    op.drop_table("adapter_versions")
