"""The job options as typed values: the CLI's flags become one JobRequest, and the rows keep them as before."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from ground.errors import UserError
from ground.spec.schema import ResourcesSpec
from idmctl.cli.commands import job_flags
from idmctl.core.job_options import RESOURCE_FIELDS, JobOptions, JobRequest, flag_of, resource_of

ROW_FLAGS = {"--qos": "sub", "--gres": "gpu:4", "-c": 8, "--mem": "100GB", "-J": "x", "--time": "2:00:00",
             "--retries": 2, "--entry": "tests.jobs_entry", "--hold": True, "--exclude": ["n1", "n2"]}
"""A job row's ``flags`` as submit has always written them (flag spellings, --gres as typed)."""


def test_the_cli_turns_its_flags_into_one_typed_request() -> None:
    request = job_flags.flags("sub", "gpu:4", 8, "100GB", "n1,n2", "x", "2:00:00", 2, "tests.jobs_entry", None, True)
    assert request == JobRequest(qos="sub", gpus_per_node=4, cpus_per_node=8, mem="100GB", exclude=("n1", "n2"),
                                 job_name="x", time_limit="2:00:00", retries=2, entry="tests.jobs_entry", hold=True)
    assert job_flags.flags(*[None] * 9) == JobRequest()


def test_a_malformed_gres_is_bad_input_naming_the_flag() -> None:
    with pytest.raises(UserError) as raised:
        job_flags.flags(None, "gpus:4", *[None] * 7)
    assert raised.value.file == "--gres" and "'gpus:4' is not gpu:N" in str(raised.value)


def test_rows_keep_the_flags_in_their_old_form_and_old_rows_read_back() -> None:
    request = JobRequest.from_given(ROW_FLAGS)
    assert request.gpus_per_node == 4 and request.exclude == ("n1", "n2") and request.hold is True
    assert request.given() == ROW_FLAGS
    assert JobRequest.from_given({"--hold": None, "--nodelist": "old"}) == JobRequest()  # unknown/none: ignored
    assert JobRequest.from_given({"--partition": "gpu"}).partition == "gpu"  # a flag rows now keep
    assert JobRequest().given() == {} and JobRequest(cpus_per_node=0).given() == {"-c": 0}  # 0 is a value


def test_every_option_names_its_flag_and_each_resource_field_exists_where_it_lands() -> None:
    assert [flag_of(f.name) for f in fields(JobRequest)] == ["--qos", "--time", "--mem", "-c", "--gres", "--account",
                                                             "--partition", "--constraint", "--reservation", "-J",
                                                             "--exclude", "--retries", "--entry", "--build", "--hold",
                                                             "--dependency", "--kill-on-invalid-dep"]
    options, resources = JobOptions.__dataclass_fields__, ResourcesSpec.model_fields
    assert RESOURCE_FIELDS == ("qos", "time_limit", "mem", "cpus_per_node", "gpus_per_node", "account", "partition",
                               "constraint", "reservation")
    assert all(name in options and resource_of(name) in resources for name in RESOURCE_FIELDS)


def test_a_dependency_round_trips_through_the_row_and_lands_in_the_header() -> None:
    from idmctl.job.render import _sbatch_lines

    request = JobRequest(dependency="afterok:4242", kill_on_invalid_dep=True)
    assert request.given() == {"--dependency": "afterok:4242", "--kill-on-invalid-dep": True}
    assert JobRequest.from_given(request.given()) == request
    options = JobOptions(job_name="x", qos="sub", partition=None, nodes=1, ranks_per_node=1, cpus_per_node=1,
                         mem="1GB", gpus_per_node=0, time_limit="0:10:00", dependency="afterok:4242",
                         kill_on_invalid_dep=True)
    lines = _sbatch_lines(options, "/tmp/x-%j.out")
    assert lines[-2:] == ["#SBATCH --dependency=afterok:4242", "#SBATCH --kill-on-invalid-dep=yes"]
    with pytest.raises(UserError) as raised:
        _sbatch_lines(replace(options, dependency="afterok:1\n#SBATCH --qos=high"), "/tmp/x-%j.out")
    assert raised.value.field == "--dependency" and "is not a Slurm dependency" in str(raised.value)
