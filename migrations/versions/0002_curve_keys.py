"""CURVE keys of Logjam producers (auth.curve.CurveKey).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00

Self-contained, like 0001: the table as it is at this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "curve_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("public_key", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_curve_keys"),
        sa.UniqueConstraint("name", name="uq_curve_keys_name"),
        sa.UniqueConstraint("public_key", name="uq_curve_keys_public_key"),
    )


def downgrade() -> None:
    op.drop_table("curve_keys")
