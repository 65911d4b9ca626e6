"""Leases in their own table (several workers per job), lost-lease count, the owning API key.

A job may now be run by ``search.parallel_workers`` workers at once, so its claim moves from two
columns of ``jobs`` to one ``job_leases`` row per worker. ``leases_lost`` counts leases that ran out
(the give-up rule); ``owner`` is the hash of the API key that created the job (only it sees the job;
jobs created before this revision belong to the open scope "").

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # A running job of the old schema keeps its worker: its lease becomes a row. The rows wait in a table
    # without a foreign key while ``jobs`` is rebuilt (SQLite's batch mode drops and recreates ``jobs``,
    # which would cascade to ``job_leases``).
    op.execute("CREATE TABLE job_leases_0002 AS SELECT id AS job_id, lease_owner AS worker, "
               "updated_at AS claimed_at, lease_expires_at AS expires_at FROM jobs "
               "WHERE status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("leases_lost", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=False, server_default=""))
        batch_op.drop_column("lease_owner")
        batch_op.drop_column("lease_expires_at")
        batch_op.create_index("ix_jobs_owner_status", ["owner", "status"], unique=False)
    op.create_table(
        "job_leases",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_leases_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "worker", name=op.f("pk_job_leases")),
    )
    op.execute("INSERT INTO job_leases (job_id, worker, claimed_at, expires_at) "
               "SELECT job_id, worker, claimed_at, expires_at FROM job_leases_0002")
    op.drop_table("job_leases_0002")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_owner_status")
        batch_op.add_column(sa.Column("lease_expires_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=200), nullable=True))
        batch_op.drop_column("owner")
        batch_op.drop_column("leases_lost")
    op.drop_table("job_leases")
