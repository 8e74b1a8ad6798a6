"""Initial auth schema: users, shared keys, client networks, audit log.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

Self-contained on purpose: it spells out the tables as they were at this
revision instead of importing the models, which will change after it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("password_sealed", sa.LargeBinary(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        _timestamp("last_login_at", nullable=True),
        sa.Column("last_login_address", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("name", name="uq_users_name"),
    )
    op.create_table(
        "client_networks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cidr", sa.String(length=64), nullable=False),
        sa.Column("allow_anonymous", sa.Boolean(), nullable=False),
        sa.Column("restrict_users", sa.Boolean(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_client_networks"),
        sa.UniqueConstraint("cidr", name="uq_client_networks_cidr"),
    )
    op.create_table(
        "client_network_users",
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["network_id"],
            ["client_networks.id"],
            name="fk_client_network_users_network_id_client_networks",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name="fk_client_network_users_user_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("network_id", "user_id", name="pk_client_network_users"),
    )
    op.create_index("ix_client_network_users_user_id", "client_network_users", ["user_id"])
    op.create_table(
        "shared_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("secret_sealed", sa.LargeBinary(), nullable=False),
        sa.Column("network_id", sa.Integer(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.ForeignKeyConstraint(
            ["network_id"],
            ["client_networks.id"],
            name="fk_shared_keys_network_id_client_networks",
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_shared_keys"),
        sa.UniqueConstraint("name", name="uq_shared_keys_name"),
    )
    op.create_index("ix_shared_keys_network_id", "shared_keys", ["network_id"])
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        _timestamp("at"),
        sa.Column("actor", sa.String(length=255), nullable=True),
        sa.Column("source_address", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_shared_keys_network_id", table_name="shared_keys")
    op.drop_table("shared_keys")
    op.drop_index("ix_client_network_users_user_id", table_name="client_network_users")
    op.drop_table("client_network_users")
    op.drop_table("client_networks")
    op.drop_table("users")
