"""The top distinct parallel layouts of a finished job.

A search now reports, beside its top K configs, the best config of each of its top K distinct layouts
(tp, pp, cp, ep, etp) with its rank and how many variants fit (``GET /v1/jobs/{id}/layouts``). They are
kept as one JSON list on the job: a layout's best config may rank beyond K, so it is not always a row of
``job_configs``, and the list is read whole. Jobs finished before this revision have none (null).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("layouts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("layouts")
