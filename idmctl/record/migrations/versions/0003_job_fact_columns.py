"""a job's facts in their own columns: the submission request stays in options_json, admission, code
snapshot, sacct runs, efficiency, derived exit code, committed step, controller, end claim, notices and
the eval link each get a column (the data step moves each key of existing rows out of options_json)

Revision ID: 0003
Revises: 0002
"""

import json

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

JSON_FACTS = ("admitted", "code", "runs", "efficiency", "committed_step", "controller", "end_recorded", "notified")
"""Keys of options_json that move, unchanged, into a JSON column of the same name."""
EVAL_FIELDS = {"of_chain": sa.Integer(), "step": sa.Integer(), "after": sqlmodel.sql.sqltypes.AutoString(),
               "choice": sqlmodel.sql.sqltypes.AutoString(), "replaces": sa.Integer(), "moved_to": sa.Integer()}
"""The eval link (options_json's ``eval`` object): each field becomes the column ``eval_<field>``."""
EVAL_TEXT_FIELDS = ("after", "choice")


def _job_table() -> sa.Table:
    return sa.table("job", sa.column("id", sa.Integer()), sa.column("options_json", sa.String()),
                    sa.column("derived_exit_code", sa.String()),
                    *(sa.column(name, sa.JSON(none_as_null=True)) for name in JSON_FACTS),
                    *(sa.column(f"eval_{name}", kind) for name, kind in EVAL_FIELDS.items()))


def _as_int(value):
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        for name in JSON_FACTS:
            batch_op.add_column(sa.Column(name, sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column('derived_exit_code', sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        for name, kind in EVAL_FIELDS.items():
            batch_op.add_column(sa.Column(f'eval_{name}', kind, nullable=True))
        batch_op.create_index(batch_op.f('ix_job_eval_of_chain'), ['eval_of_chain'], unique=False)
    job = _job_table()
    connection = op.get_bind()
    for row_id, text in connection.execute(sa.select(job.c.id, job.c.options_json)).all():
        try:
            options = json.loads(text or "{}")
        except ValueError:
            continue  # a row damaged outside idmctl stays as it was: reading it names the job
        if not isinstance(options, dict):
            continue
        values = {name: options.pop(name) for name in JSON_FACTS if name in options}
        if "derived_exit_code" in options:
            code = options.pop("derived_exit_code")
            values["derived_exit_code"] = None if code is None else str(code)
        link = options.pop("eval", None)
        if isinstance(link, dict):
            for name in EVAL_FIELDS:
                value = link.get(name)
                text_field = name in EVAL_TEXT_FIELDS
                values[f"eval_{name}"] = (None if value is None else str(value)) if text_field else _as_int(value)
        if values:
            connection.execute(sa.update(job).where(job.c.id == row_id)
                               .values(options_json=json.dumps(options), **values))


def downgrade() -> None:
    job = _job_table()
    connection = op.get_bind()
    names = [*JSON_FACTS, "derived_exit_code", *(f"eval_{name}" for name in EVAL_FIELDS)]
    query = sa.select(job.c.id, job.c.options_json, *(job.c[name] for name in names))
    for row in connection.execute(query).mappings().all():
        try:
            options = json.loads(row["options_json"] or "{}")
        except ValueError:
            options = None
        if not isinstance(options, dict):
            continue
        folded = {name: row[name] for name in (*JSON_FACTS, "derived_exit_code") if row[name] is not None}
        link = {name: row[f"eval_{name}"] for name in EVAL_FIELDS if row[f"eval_{name}"] is not None}
        if link:
            folded["eval"] = link
        if folded:
            connection.execute(sa.update(job).where(job.c.id == row["id"])
                               .values(options_json=json.dumps({**options, **folded})))
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_eval_of_chain'))
        for name in reversed(names):
            batch_op.drop_column(name)
