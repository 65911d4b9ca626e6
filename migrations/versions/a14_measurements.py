"""Measured runs and profile versions: a team's runs in, refitted cluster profiles out.

``measurements`` holds the runs posted to ``POST /v1/clusters/{name}/measurements`` (the published-runs
format), each owned by the API key that posted it; ``profile_versions`` the profiles refitted on them
(``POST /v1/clusters/{name}/versions``), numbered per owner and cluster, with the full profile, its
hash and the fit's figures. New tables only: nothing of the jobs' schema changes.

Revision ID: a14_measurements
Revises: 0003
Create Date: 2026-12-07

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "a14_measurements"
down_revision: Union[str, Sequence[str], None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "measurements",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False, server_default=""),
        sa.Column("cluster_name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("run", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
    )
    op.create_index("ix_measurements_owner_cluster_name_created_at", "measurements",
                    ["owner", "cluster_name", "created_at"], unique=False)
    op.create_table(
        "profile_versions",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("cluster_name", sa.String(length=200), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("profile_version", sa.String(length=64), nullable=False),
        sa.Column("measurement_ids", sa.JSON(), nullable=False),
        sa.Column("mape_before", sa.Float(), nullable=False),
        sa.Column("mape_after", sa.Float(), nullable=False),
        sa.Column("published_mape_before", sa.Float(), nullable=True),
        sa.Column("published_mape_after", sa.Float(), nullable=True),
        sa.Column("published_worse", sa.Boolean(), nullable=False),
        sa.Column("fit", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("owner", "cluster_name", "number", name=op.f("pk_profile_versions")),
    )


def downgrade() -> None:
    op.drop_table("profile_versions")
    op.drop_index("ix_measurements_owner_cluster_name_created_at", table_name="measurements")
    op.drop_table("measurements")
