"""Paired shadow samples, and fit jobs whose version goes to shadow


A shadow version is evaluated on the path that served the request (``transfer`` or ``map_quote``)
beside the active version that served it, against one native re-run: ``answer_kl`` is the mean
per-token KL(native || version) over the teacher-forced answer tokens, ``baseline_id`` the version
that served the request and ``baseline_kl`` its ``answer_kl`` on the same tokens. Rows from before
this revision, and samples with no version serving beside them, have none of the three.

``fit_jobs.shadow``: the job registers its version in ``shadow`` status (the bootstrap's second
stage, ``bootstrap.then``), to be promoted on paired shadow evaluation. Rows from before this
revision are not shadow jobs.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("shadow_samples", sa.Column("answer_kl", sa.Float, nullable=True))
    op.add_column("shadow_samples", sa.Column("baseline_id", sa.Integer, nullable=True))
    op.add_column("shadow_samples", sa.Column("baseline_kl", sa.Float, nullable=True))
    op.add_column("fit_jobs", sa.Column("shadow", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("fit_jobs") as batch:
        batch.drop_column("shadow")
    with op.batch_alter_table("shadow_samples") as batch:
        for name in ("baseline_kl", "baseline_id", "answer_kl"):
            batch.drop_column(name)
