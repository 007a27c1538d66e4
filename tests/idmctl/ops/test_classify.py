"""The classifier on real log texts: each failure is produced for real where this machine can
(torch DataLoader errors, a real TypeError, a real full tmpfs); Slurm's own lines are copied from
the local cluster's logs; only CUDA OOM is a quoted text (no GPU here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ground.errors import UserError
from idmctl.gate.build import BUILD_CHECK_NAMES
from idmctl.core.job_state import is_failed
from idmctl.ops.failures.classify import (
    classify, cause_names, load_taxonomy, marker_line, parse_traceback,
)

PREFLIGHT_CHECKS = {"spec", "introspection", "loader", "shm", "io", "qos", "disk", "cache", "smoke", "none",
                    *BUILD_CHECK_NAMES}


def run_python(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=120)


def can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


def test_taxonomy_is_complete_and_points_at_real_checks() -> None:
    names = cause_names()
    for required in ("queue_cancelled", "preempted", "timeout", "oom_host", "oom_cuda", "shm_enospc",
                     "loader_config", "python_exception", "nan_loss", "node_fail", "stage_failed", "unknown"):
        assert required in names
    assert names[-1] == "unknown"
    for cause in load_taxonomy():
        assert cause.caught_by in PREFLIGHT_CHECKS, cause.name
        assert cause.mlflow_status in ("FAILED", "KILLED"), cause.name
        assert cause.meaning and cause.fix


def test_loader_config_from_real_dataloader_valueerror(tmp_path: Path) -> None:
    trainer = tmp_path / "idm_training.py"
    trainer.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        def build_loader(num_workers):
            return DataLoader(list(range(4)), num_workers=num_workers,
                              persistent_workers=True)

        build_loader(0)
        """))
    result = run_python(trainer)
    assert result.returncode == 1
    found = classify("FAILED", exit_code="1:0", log_tail=result.stderr, started=True)
    assert found.cause == "loader_config"
    assert found.detail["exception_type"] == "ValueError"
    assert found.detail["message"] == "persistent_workers option needs num_workers > 0"
    assert found.detail["frame"] == f"{trainer}:5"
    assert "ValueError: persistent_workers option needs num_workers > 0" in found.evidence
    assert found.headline == f"ValueError: persistent_workers option needs num_workers > 0 at {trainer}:5"


def test_python_exception_typeerror_names_the_class_and_the_calling_frame(tmp_path: Path) -> None:
    # Card A 6321: the kwarg was added to the look-alike class, the other one is constructed.
    (tmp_path / "dataset_latent_idm.py").write_text(textwrap.dedent("""\
        class HiddenRawDataset:
            def __init__(self, root, selected_layer_indices=None):
                self.root = root

        class HiddenMultiLayerDataset:
            def __init__(self, root):
                self.root = root
        """))
    entry = tmp_path / "train_entry.py"
    entry.write_text(textwrap.dedent("""\
        import sys
        sys.path.insert(0, sys.argv[1])
        from dataset_latent_idm import HiddenMultiLayerDataset

        def build(root):
            return HiddenMultiLayerDataset(root, selected_layer_indices=[1, 4, 7, 10])

        build("/cache")
        """))
    result = run_python(entry, str(tmp_path))
    log = "staging cache... done\n" + result.stderr
    found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
    assert found.cause == "python_exception"
    assert found.detail["exception_type"] == "TypeError"
    assert "HiddenMultiLayerDataset.__init__() got an unexpected keyword argument 'selected_layer_indices'" \
        == found.detail["message"]
    assert found.detail["frame"] == f"{entry}:6"
    assert found.detail["function"] == "build"


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and unshare to mount a private tmpfs")
def test_shm_enospc_from_dataloader_workers_overflowing_a_small_dev_shm(tmp_path: Path) -> None:
    script = tmp_path / "smoke_loader.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, Dataset
        torch.set_num_threads(1)

        class FourMegabyteSamples(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, index):
                return torch.zeros(1024 * 1024)

        for batch in DataLoader(FourMegabyteSamples(), batch_size=2, num_workers=2):
            pass
        """))
    # A 1 MB /dev/shm in a private mount namespace: each 8 MB batch must pass through it.
    command = f"mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && {sys.executable} {script}"
    result = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    found = classify("FAILED", exit_code="1:0", log_tail=result.stderr, started=True)
    assert found.cause == "shm_enospc"
    assert any("No space left on device" in line for line in found.evidence)
    assert found.detail["frame"] == f"{script}:11"


# The log of the suite's replay of 5845 when the DataLoader's main process hung after a worker's ENOSPC
# (copied from its job log): the worker's traceback, then the watchdog's hang marker 125 s later.
SHM_ENOSPC_THEN_HANG = """\
idmctl: watchdog on n1: hang when the heartbeat stops for max(10 × s/step, 120 s), checked every 5 s
replay_shm_overflow 0770b149aade: world 1, grad_accum 1, fresh start at step 0
Traceback (most recent call last):
RuntimeError: unable to allocate shared memory(shm) for file </torch_8431_1006298694_5>: No space left on device (28)
idmctl: watchdog: no heartbeat for 125.0 s since step 0 at 2026-12-07T03:52:23.361+00:00 > max(10 × no step timed yet, 120 s) = 120.0 s; dumping every rank's Python stacks (SIGUSR2)
IDMCTL_FAILURE cause=hang node=n1 step=0 last_beat=2026-12-07T03:52:23.361+00:00 silent_s=125.0 threshold_s=120.0 k=10 floor_s=120 s_per_step=none
srun: error: n1: task 0: Killed
idmctl: trainer exited 79 at 2026-12-07T03:54:30+00:00
"""


def test_a_hang_after_a_dev_shm_enospc_is_the_enospc() -> None:
    found = classify("FAILED", exit_code="79:0", log_tail=SHM_ENOSPC_THEN_HANG, started=True)
    assert found.cause == "shm_enospc"  # stop and fix the loader, not exclude the node and hang again
    assert any("No space left on device" in line for line in found.evidence)
    alone = "\n".join(line for line in SHM_ENOSPC_THEN_HANG.splitlines() if "No space left" not in line)
    assert classify("FAILED", exit_code="79:0", log_tail=alone, started=True).cause == "hang"


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and unshare to mount a private tmpfs")
def test_stage_failed_from_a_real_cp_into_a_full_disk(tmp_path: Path) -> None:
    source = tmp_path / "cache.bin"
    source.write_bytes(b"\0" * 2_000_000)
    dest = tmp_path / "stage"
    dest.mkdir()
    command = f"mount -t tmpfs -o size=1m tmpfs {dest} && cp {source} {dest}/"
    result = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True)
    assert result.returncode != 0
    found = classify("FAILED", exit_code="1:0", log_tail=result.stderr, started=True)
    assert found.cause == "stage_failed"
    assert "No space left on device" in found.headline


def test_marker_lines_carry_their_fields() -> None:
    log = "step 11 loss 1.14\n" + marker_line("nan_loss", step=12, loss="nan") + "\n"
    found = classify("FAILED", exit_code="3:0", log_tail=log, started=True)
    assert found.cause == "nan_loss"
    assert found.detail == {"cause": "nan_loss", "step": "12", "loss": "nan"}
    staged = classify("FAILED", exit_code="1:0", started=True,
                      log_tail=marker_line("stage_failed", dest="/tmp/idm_cache", need_bytes=6_600_000_000_000))
    assert staged.cause == "stage_failed"
    assert staged.detail["need_bytes"] == "6600000000000"


def test_queue_cancelled_shows_the_wait() -> None:
    found = classify("CANCELLED by 0", exit_code="0:0", waited_seconds=6 * 86400, started=False)
    assert found.cause == "queue_cancelled"
    assert found.detail["waited_seconds"] == 518400
    assert found.evidence[0] == "Slurm: State=CANCELLED by 0 ExitCode=0:0 waited 6.0 d (518,400 s)"
    assert found.headline == "cancelled after waiting 6.0 d in the queue, never started"
    running = classify("CANCELLED by 0", exit_code="0:15", started=True)
    assert running.cause == "cancelled"


def test_a_cancel_is_judged_by_the_log_before_it() -> None:
    """A traceback the job printed while being torn down (srun's pipe closed under a print) is the
    cancel's doing; one printed before the cancel is the cause (a rank crashed, the rest hung)."""
    teardown = ("entry: step 7\nsrun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
                "slurmstepd-n1: error: *** JOB 477 ON n1 CANCELLED AT 2026-11-30T11:21:11 ***\n"
                "Traceback (most recent call last):\n  File \"/repo/tests/jobs_entry.py\", line 66, in _steps\n"
                "BrokenPipeError: [Errno 32] Broken pipe\n")
    assert classify("CANCELLED by 0", exit_code="0:0", log_tail=teardown, started=True).cause == "cancelled"
    crashed_then_cancelled = ("Traceback (most recent call last):\n  File \"/repo/trainers/train.py\", line 9, in fit\n"
                              "RuntimeError: rank 1 lost its peer\n"
                              "slurmstepd-n1: error: *** JOB 478 ON n1 CANCELLED AT 2026-11-30T11:30:00 ***\n")
    found = classify("CANCELLED by 0", exit_code="0:0", log_tail=crashed_then_cancelled, started=True)
    assert found.cause == "python_exception"
    # A preemption's line says DUE TO PREEMPTION and is not a cancel by hand.
    preempted = "slurmstepd-n1: error: *** JOB 479 ON n1 CANCELLED AT 2026-11-30T11:40:00 DUE TO PREEMPTION ***\n"
    assert classify("CANCELLED", exit_code="0:0", log_tail=preempted, started=True).cause == "preempted"


def test_scheduler_states_win_over_log_patterns() -> None:
    # A preempted trainer may print a traceback while dying; the state is the cause.
    log = ("Traceback (most recent call last):\n  File \"/x/train.py\", line 3, in <module>\nKeyboardInterrupt\n"
           "slurmstepd: error: *** JOB 6054 ON n1 CANCELLED AT 2026-11-30T02:10:01 DUE TO PREEMPTION ***\n")
    found = classify("PREEMPTED", exit_code="0:15", log_tail=log, restarts=2, started=True)
    assert found.cause == "preempted"
    assert found.detail["restarts"] == 2
    assert classify("TIMEOUT", exit_code="0:0", started=True).cause == "timeout"
    assert classify("NODE_FAIL", exit_code="0:0", started=True).cause == "node_fail"
    oom = classify("OUT_OF_MEMORY", reason="OutOfMemory", exit_code="0:125", started=True,
                   log_tail="slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some of the step tasks have been OOM Killed.")
    assert oom.cause == "oom_host"
    assert "Detected 1 oom_kill event" in oom.evidence[1]


def test_cuda_oom_quoted_text() -> None:
    # No GPU here: torch's CUDA OOM message as PyTorch prints it.
    log = ("Traceback (most recent call last):\n  File \"/w/trainers/fit.py\", line 88, in fit\n    loss.backward()\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
           "of 79.15 GiB of which 1.02 GiB is free.\n")
    found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
    assert found.cause == "oom_cuda"
    assert found.detail["exception_type"] == "torch.OutOfMemoryError"
    assert found.detail["frame"] == "/w/trainers/fit.py:88"


def test_unknown_keeps_the_last_lines() -> None:
    found = classify("FAILED", exit_code="7:0", log_tail="starting\nsomething odd happened\n", started=True)
    assert found.cause == "unknown"
    assert found.evidence == ["Slurm: State=FAILED ExitCode=7:0", "starting", "something odd happened"]


def test_failed_states() -> None:
    assert is_failed("CANCELLED by 0") and is_failed("OUT_OF_MEMORY") and is_failed("PREEMPTED")
    assert not is_failed("COMPLETED") and not is_failed("RUNNING") and not is_failed(None)


def test_parse_traceback_without_project_frames() -> None:
    lines = ["Traceback (most recent call last):", '  File "/v/lib/python3.11/site-packages/a.py", line 1, in f',
             "ZeroDivisionError: division by zero"]
    assert parse_traceback(lines) == {"exception_type": "ZeroDivisionError", "message": "division by zero"}


def test_a_traceback_python_ignored_is_never_the_evidence() -> None:
    """A local job's log: the trainer's TypeError, then the watchdog's "Exception ignored in" report of a
    SystemExit it raised while its interpreter shut down. The job failed of the TypeError."""
    log = ("Traceback (most recent call last):\n"
           '  File "/w/cache/dataset.py", line 568, in __init__\n'
           "TypeError: __init__() got an unexpected keyword argument 'selected_layer_indices'\n"
           "idmctl: watchdog on vm: hang when the heartbeat stops for max(10 × s/step, 600 s), checked every 30 s\n"
           "Exception ignored in: <module 'threading' from '/usr/lib/python3.11/threading.py'>\n"
           "Traceback (most recent call last):\n"
           '  File "/usr/lib/python3.11/threading.py", line 1541, in _shutdown\n'
           "    def _shutdown():\n"
           "    \n"
           '  File "/w/trainers/watchdog.py", line 126, in <lambda>\n'
           "    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
           "                                             ^^^^^^^^^^^\n"
           "SystemExit: 0\n"
           "idmctl: trainer exited 1 at 2026-12-02T15:45:30+00:00\n")
    assert parse_traceback(log.splitlines()) == {
        "exception_type": "TypeError", "message": "__init__() got an unexpected keyword argument 'selected_layer_indices'",
        "frame": "/w/cache/dataset.py:568", "function": "__init__"}
    only_ignored = log.splitlines()[4:]
    assert parse_traceback(only_ignored) == {}


def test_bad_taxonomy_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "taxonomy.yaml"
    bad.write_text("causes:\n  - {name: x, meaning: m, fix: f, caught_by: none, action: stop,"
                   " mlflow_status: FAILED, rules: [{stat: [FAILED]}]}\n")
    with pytest.raises(UserError) as error:
        load_taxonomy(bad)
    assert error.value.line().startswith(f"error: {bad}:causes[0].rules: unknown condition 'stat'")


def test_a_tail_cut_inside_a_traceback_still_names_the_exception() -> None:
    log = ('  File "/w/.venv/lib/python3.11/site-packages/sqlalchemy/engine/base.py", line 1977, in _exec\n'
           '    self.dialect.do_execute(\n'
           '  File "/w/trainers/tracking.py", line 40, in open_run\n'
           '    client.create_run(experiment_id)\n'
           'sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) duplicate column name: step\n'
           'srun: error: n2: task 0: Exited with exit code 1\n')
    found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
    assert found.cause == "python_exception"
    assert found.detail["exception_type"] == "sqlalchemy.exc.OperationalError"
    assert found.detail["frame"] == "/w/trainers/tracking.py:40"


# Real logs of the failure corpus (tests/idmctl/ops/failure_corpus/*.yaml: each case names its public source
# and licence), for what the corpus test does not pin: evidence, headlines and the roles' order.
def corpus_log(case_id: str) -> str:
    for path in sorted(CORPUS.glob("*.yaml")):
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["cases"]:
            if case["id"] == case_id:
                return case["log"]
    raise AssertionError(f"no corpus case {case_id}")


CORPUS = Path(__file__).resolve().parent / "failure_corpus"


def test_the_headline_survives_rank_prefixes() -> None:
    # host_data-073: every line of the traceback starts with torch's "[rank1]: ".
    found = classify("FAILED", exit_code="1:0", log_tail=corpus_log("host_data-073"), started=True)
    assert found.cause == "python_exception"
    assert found.headline == ("AttributeError: 'GPT2LMHeadModel' object has no attribute 'model' at "
                              "/workspace/distributed-training-guide/04-fully-sharded-data-parallel/train_llm.py:88")
    assert found.evidence[1:] == [
        "[rank1]: AttributeError: 'GPT2LMHeadModel' object has no attribute 'model'",
        '[rank1]:   File "/workspace/distributed-training-guide/04-fully-sharded-data-parallel/train_llm.py", '
        'line 88, in main']


def test_srun_labels_and_an_unindented_traceback(tmp_path: Path) -> None:
    """A real traceback as `srun --label` prints it (each line after its task's right-aligned "0: "), and the
    same traceback pasted without its indentation."""
    entry = tmp_path / "entry.py"
    entry.write_text("def build(root):\n    return dict(root)\n\nbuild(3)\n")
    result = run_python(entry)
    assert result.returncode == 1
    labelled = "".join(f" 0: {line}\n" for line in result.stderr.splitlines())
    unindented = "\n".join(line.strip() for line in result.stderr.splitlines())
    for log in (labelled, unindented):
        found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
        assert found.cause == "python_exception"
        assert found.headline == f"TypeError: 'int' object is not iterable at {entry}:2"


def test_the_earliest_root_wins_over_its_cascade_and_teardown() -> None:
    # gpu_net-056 (BigScience tr1-13B logbook): the ECC error, then the C++ abort and its frames.
    found = classify("FAILED", exit_code="0:6", log_tail=corpus_log("gpu_net-056"), started=True)
    assert found.cause == "gpu_hardware"
    assert found.evidence[1:] == [
        "RuntimeError: transform: failed to synchronize: cudaErrorECCUncorrectable: uncorrectable ECC error encountered",
        "what():  CUDA error: uncorrectable ECC error encountered"]
    # The same root, then every other rank's NCCL watchdog (gpu_net-001's lines) and srun's teardown.
    cascade = corpus_log("gpu_net-001")
    log = corpus_log("gpu_net-056") + cascade + "srun: error: n3: task 3: Exited with exit code 1\n"
    assert classify("FAILED", exit_code="1:0", log_tail=log, started=True).cause == "gpu_hardware"
    assert classify("FAILED", exit_code="1:0", log_tail=cascade, started=True).cause == "collective_timeout"


def test_specific_states_keep_their_cause_unless_the_log_names_the_root_behind_them() -> None:
    ecc = corpus_log("gpu_net-056")
    assert classify("NODE_FAIL", exit_code="0:0", log_tail=ecc, started=True).cause == "gpu_hardware"  # refines node_fail
    watchdog = corpus_log("gpu_net-001")
    assert classify("NODE_FAIL", exit_code="0:0", log_tail=watchdog, started=True).cause == "node_fail"  # a cascade
    assert classify("TIMEOUT", exit_code="0:0", log_tail=ecc, started=True).cause == "timeout"
    # A generic state: a hang cancelled by hand is the hang (collective_timeout), not `cancelled`.
    assert classify("CANCELLED by 1000", exit_code="0:15", log_tail=watchdog, started=True).cause == "collective_timeout"
    # host_data-084: a training frozen at the end of an epoch, ^C'd: the traceback ends in the DataLoader queue's wait.
    frozen = classify("CANCELLED by 1000", exit_code="0:15", log_tail=corpus_log("host_data-084"), started=True)
    assert (frozen.cause, frozen.headline) == ("hang", 'File "/home/yimengzh/miniconda2/envs/pytorch/lib/python3.5/'
                                                       'queue.py", line 164, in get')
    step = ("slurmstepd: error: *** STEP 1234.0 ON n7 CANCELLED AT 2026-11-30T10:01:02 DUE TO NODE FAILURE, "
            "SEE SLURMCTLD LOG FOR DETAILS ***")
    assert classify("FAILED", exit_code="1:0", log_tail=step, started=True).cause == "node_fail"


def test_shm_enospc_is_not_disk_full() -> None:
    shm = corpus_log("host_data-016")  # NCCL's shm segment: posix_fallocate ... No space left on device
    assert classify("FAILED", exit_code="1:0", log_tail=shm, started=True).cause == "shm_enospc"
    assert classify("FAILED", exit_code="1:0", log_tail=corpus_log("host_data-096"), started=True).cause == "disk_full"
    assert classify("FAILED", exit_code="1:0", started=True,
                    log_tail="OSError: [Errno 28] No space left on device: '/dev/shm/x'").cause == "shm_enospc"


def test_unknown_shows_the_error_line_not_the_last_lines() -> None:
    log = ("epoch 3 step 1200 loss 0.41\n"
           "ERROR: worker 3 lost its lease on /data/shard-0017\n"
           + "".join(f"teardown {i}\n" for i in range(6))
           + "/lib/x86_64-linux-gnu/libc.so.6(+0x29d90) [0x7f0e]\n"
           "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 198 closing signal SIGTERM\n")
    found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
    assert found.cause == "unknown"
    assert found.evidence[1] == "ERROR: worker 3 lost its lease on /data/shard-0017"
    assert all("SIGTERM" not in line for line in found.evidence)


def test_ansi_colours_progress_bars_and_bad_bytes() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    # a 2 MB line first (only the log's tail is read, each line cut), undecodable bytes as read_log_tail replaces them
    log = ("x" * 2_000_000 + "\n\ufffd\ufffd\n"
           + "\x1b[32m 10%|#         | 10/100\r 20%|##        | 20/100\r\x1b[31m" + oom + "\x1b[0m\n")
    found = classify("FAILED", exit_code="1:0", log_tail=log, started=True)
    assert found.cause == "oom_cuda"
    assert found.evidence[1] == oom
