"""``ground.stage.node_named``: which ``stage.dest`` values the node expands, and which stay the submitting host's."""

from __future__ import annotations

import pytest

from ground.contract import ENV_HOME
from ground.stage import NodePath, node_named


@pytest.mark.parametrize("dest,expected", [
    ("$SLURM_TMPDIR/idm", NodePath("SLURM_TMPDIR", "/idm")),
    ("${TMPDIR}/cache", NodePath("TMPDIR", "/cache")),
    ("$LOCAL_SCRATCH", NodePath("LOCAL_SCRATCH", "")),
    ("/tmp/idm_cache", None),
    (f"${ENV_HOME}/stage", None),  # the job exports the host's own value: one directory on both
    (f"${{{ENV_HOME}}}/stage", None),
    ("$slurm_tmpdir/idm", None),  # lower case: not a variable the node names (the renderer refuses its $)
    ("$SLURM_TMPDIRX-1/idm", None),  # the name must end at / or the end
    ("/scratch/$SLURM_TMPDIR", None),  # only a leading variable
])
def test_node_named(dest: str, expected: NodePath | None) -> None:
    assert node_named(dest) == expected


def test_only_slurm_tmpdir_is_per_job_by_definition() -> None:
    assert node_named("$SLURM_TMPDIR/idm").per_job and node_named("$SLURM_TMPDIR/idm").shown == "$SLURM_TMPDIR/idm"
    assert not node_named("$LOCAL_SCRATCH/idm").per_job
