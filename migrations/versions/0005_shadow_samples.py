"""shadow_samples: first-token KL and top-1 agreement of one adapter version against native

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shadow_samples",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=False),
        sa.Column("first_token_kl", sa.Float, nullable=False),
        sa.Column("top1_agreement", sa.Float, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_shadow_samples_adapter_id", "shadow_samples", ["adapter_id"])


def downgrade() -> None:
    op.drop_index("ix_shadow_samples_adapter_id", table_name="shadow_samples")
    op.drop_table("shadow_samples")
