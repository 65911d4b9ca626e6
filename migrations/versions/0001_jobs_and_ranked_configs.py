"""Jobs and their ranked configs.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("model_spec", sa.JSON(), nullable=False),
        sa.Column("cluster_name", sa.String(length=200), nullable=False),
        sa.Column("cluster_profile", sa.JSON(), nullable=False),
        sa.Column("profile_version", sa.String(length=64), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("global_batch_size", sa.Integer(), nullable=False),
        sa.Column("precision", sa.String(length=8), nullable=False),
        sa.Column("moe_load_imbalance", sa.Float(), nullable=True),
        sa.Column("search", sa.JSON(), nullable=False),
        sa.Column("paraplan_version", sa.String(length=32), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("trials_total", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("idempotency_scope", sa.String(length=64), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("idempotency_scope", "idempotency_key", name="uq_jobs_idempotency"),
    )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.create_index("ix_jobs_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_jobs_status_created_at", ["status", "created_at"], unique=False)

    op.create_table(
        "job_configs",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("evaluation", sa.JSON(), nullable=False),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_s_per_device", sa.Float(), nullable=True),
        sa.Column("mfu", sa.Float(), nullable=True),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("peak_gib", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_configs_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_job_configs")),
    )
    with op.batch_alter_table("job_configs") as batch_op:
        batch_op.create_index("ix_job_configs_job_id_mfu", ["job_id", "mfu"], unique=False)
        batch_op.create_index("ix_job_configs_job_id_peak_gib", ["job_id", "peak_gib"], unique=False)
        batch_op.create_index("ix_job_configs_job_id_tokens_per_s", ["job_id", "tokens_per_s"], unique=False)


def downgrade() -> None:
    op.drop_table("job_configs")
    op.drop_table("jobs")
