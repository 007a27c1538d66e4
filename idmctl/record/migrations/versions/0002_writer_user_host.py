"""every writer identified: user and host on each table a command writes (the team's shared store)

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

TABLES = ("spec_version", "preflight_run", "chain", "job", "failure", "fix", "node_exclusion")


def upgrade() -> None:
    # Rows written before this revision keep NULL: nobody recorded who wrote them.
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('user', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
            batch_op.add_column(sa.Column('host', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
            batch_op.create_index(batch_op.f(f'ix_{table}_user'), ['user'], unique=False)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(batch_op.f(f'ix_{table}_user'))
            batch_op.drop_column('host')
            batch_op.drop_column('user')
