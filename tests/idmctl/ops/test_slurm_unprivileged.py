"""A team without root: two unprivileged users, each with a home of their own, on the local Slurm and the
team's PostgreSQL store. Everything else in the suite runs as root, which hides permission faults; here
idmctl runs exactly as a team member starts it (``runuser``: their uid, their groups, their $HOME).

The users are made by the test (useradd; Slurm associations under account ``team``), so it needs root to
set up and is skipped without it. The project's interpreter is pyenv's under /root, which is 0700 on
Debian: for the duration of this module /root (and any other ancestor of the interpreter) is made
traversable to others (o+x, never readable) and restored afterwards.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from ground.contract import ENV_CLUSTER, ENV_DB_URL, ENV_HOME
from pg_support import fresh_database
from slurm_support import cluster_changing, release_requeued, sh, squeue_state, text_so_far, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("local_slurm"), pytest.mark.xdist_group("unprivileged")]
OPENED_LOCK = Path("/tmp/idmctl-unprivileged.lock")
"""Held while the interpreter's ancestors are opened to others: a second session (or worker) that restored
/root's mode under a running module made its members' ``python`` "Permission denied"."""
REPO = Path(__file__).resolve().parents[3]
USERS = ("idmctl-alice", "idmctl-bob")
ACCOUNT = "team"


def _ancestors_to_open() -> list[tuple[Path, int]]:
    """Folders on the way to the interpreter (and the checkout) that others cannot traverse."""
    closed = []
    for target in (Path(os.path.realpath(sys.executable)), REPO):
        for folder in target.parents:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                closed.append((folder, mode))
    return list(dict.fromkeys(closed))


def _on_node(node: str) -> str:
    """The jobs squeue shows running or ending on ``node`` (id, user, name, state), for a wait's deadline line."""
    return "; ".join(sh("squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i %u %j %T",
                        check=False).splitlines())


@pytest.fixture(scope="module")
def team_users() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("making unprivileged users needs root, useradd and runuser")
    with open(OPENED_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one module at a time on this host opens and restores the modes
        try:
            yield from _team_users()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _team_users() -> Iterator[None]:
    for user in USERS:
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True)
    with cluster_changing():  # an association added while a reader lists them would be a surprise to it
        accounts = subprocess.run(["sacctmgr", "-n", "-P", "list", "account", "format=account"],
                                  capture_output=True, text=True, check=True).stdout.split()
        if ACCOUNT not in accounts:
            subprocess.run(["sacctmgr", "-i", "add", "account", ACCOUNT, "Description=the team",
                            "Organization=idmctl"], check=True, capture_output=True)
        for user in USERS:
            subprocess.run(["sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}"], capture_output=True)
            subprocess.run(["sacctmgr", "-i", "modify", "user", user, "set", "qos+=core-own,core-extra,share,sub",
                            "DefaultQOS=share"], check=True, capture_output=True)
    opened = _ancestors_to_open()
    for folder, mode in opened:
        folder.chmod(mode | stat.S_IXOTH)
    try:
        yield
    finally:
        for folder, mode in opened:
            folder.chmod(mode)


@pytest.fixture
def team(team_users: None) -> Iterator[dict[str, Path]]:
    """Each member's ``$IDMCTL_HOME`` for this test alone: every test has a fresh store, whose job ids start at
    1 again, and a run directory of an earlier test's job 1 would be refused as another spec's."""
    homes = {}
    for user in USERS:
        home = Path(tempfile.mkdtemp(prefix="idmctl-", dir=f"/home/{user}"))
        shutil.chown(home, user, user)
        homes[user] = home
    try:
        yield homes
    finally:
        for home in homes.values():
            shutil.rmtree(home, ignore_errors=True)


def _as(user: str, home: Path, *args: str, db_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``idmctl ARGS`` as USER, from the checkout, with only what a login shell would give them."""
    environment = {"HOME": f"/home/{user}", "USER": user, "LOGNAME": user, "PATH": os.environ["PATH"],
                   "SLURM_CONF": os.environ["SLURM_CONF"], ENV_HOME: str(home), ENV_CLUSTER: "local-slurm",
                   ENV_DB_URL: db_url, "COLUMNS": "200", **env}
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in environment.items()),
                           sys.executable, "-m", "idmctl", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=180)


def test_a_member_runs_the_loop_and_another_cannot_cancel_their_job(team: dict[str, Path]) -> None:
    alice, bob = USERS
    with fresh_database() as db_url:
        done = _as(alice, team[alice], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "as a team member", "--qos", "core-own", "--json", db_url=db_url)
        assert done.returncode == 0, done.stderr
        submitted = json.loads(done.stdout)
        log = Path(submitted["log"])
        assert log.parent.owner() == alice  # the run directory is the member's, in their own home

        def ended() -> dict | None:
            synced = _as(alice, team[alice], "sync", db_url=db_url)
            assert synced.returncode == 0, synced.stderr
            rows = json.loads(_as(alice, team[alice], "jobs", "--json", db_url=db_url).stdout)
            return rows[0] if rows[0]["state"] == "COMPLETED" else None

        row = wait_until(ended, 120, f"{alice}'s job {submitted['scheduler_id']} to complete", poll_s=1.0)
        assert row["user"] == alice

        # A long one, which bob sees in the team's store and tries to cancel: Slurm refuses a job that is
        # not his, and the record is left as it was.
        done = _as(alice, team[alice], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "to be cancelled", "--qos", "core-own", "--json", db_url=db_url,
                   IDMCTL_TEST_BEHAVIOR="steps:600:0.2")
        assert done.returncode == 0, done.stderr
        running = json.loads(done.stdout)
        wait_until(lambda: squeue_state(running["scheduler_id"]) == "RUNNING", 60,
                   f"{alice}'s job {running['scheduler_id']} to start")
        seen = json.loads(_as(bob, team[bob], "jobs", "--user", alice, "--json", db_url=db_url).stdout)
        assert {r["job"] for r in seen} == {submitted["job"], running["job"]}
        refused = _as(bob, team[bob], "cancel", str(running["job"]), db_url=db_url)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert lines == [f"error: cannot cancel job {running['job']} (Slurm job {running['scheduler_id']}): it is {alice}'s, "
                         "and Slurm lets only its owner or an operator cancel it (scancel: Access/permission denied); "
                         "nothing recorded"], lines
        assert squeue_state(running["scheduler_id"]) == "RUNNING"
        # nothing recorded as cancelled: the job still runs in the record and its chain may still be retried
        assert _chain_status(db_url, running["chain"]) == "ACTIVE"
        seen = {r["job"]: r for r in json.loads(_as(bob, team[bob], "jobs", "--json", db_url=db_url).stdout)}
        assert seen[running["job"]]["state"] in ("PENDING", "RUNNING"), seen[running["job"]]
        own = _as(alice, team[alice], "cancel", str(running["job"]), db_url=db_url)
        assert own.returncode == 0, own.stderr
        wait_until(lambda: squeue_state(running["scheduler_id"]) in ("", "CANCELLED", "COMPLETING"), 60,
                   f"{alice}'s job {running['scheduler_id']} to leave the queue after her own cancel")


@contextmanager
def _shared_code_store() -> Iterator[tuple[Path, Path]]:
    """(the team's code store, a profile naming it): a folder every member writes, like /tmp."""
    team_dir = Path(tempfile.mkdtemp(prefix="idmctl-team-", dir="/home"))  # not pytest's: its folders are 0700
    team_dir.chmod(0o755)
    shared = team_dir / "code"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: everyone writes, nobody removes another's entries
    profile = team_dir / "team-slurm.yaml"
    profile.write_text((REPO / "clusters" / "local-slurm.yaml").read_text() + f"\ncode_store: {shared}\n")
    profile.chmod(0o644)
    try:
        yield shared, profile
    finally:
        shutil.rmtree(team_dir, ignore_errors=True)


def test_a_shared_code_store_serves_both_members_and_gc_leaves_a_colleagues_snapshot(team: dict[str, Path]) -> None:
    alice, bob = USERS
    with _shared_code_store() as (shared, profile):
        with fresh_database() as db_url:
            ids = {}
            for user in (alice, bob):
                done = _as(user, team[user], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force",
                           "--reason", "shared store", "--qos", "core-own", "--json", db_url=db_url,
                           IDMCTL_CLUSTER=str(profile))
                assert done.returncode == 0, f"{user}: {done.stderr}"
                ids[user] = json.loads(done.stdout)["job"]

            def both_ended() -> bool:
                for user in (alice, bob):  # each member's sync records that member's jobs
                    synced = _as(user, team[user], "sync", db_url=db_url, IDMCTL_CLUSTER=str(profile))
                    assert synced.returncode == 0, f"{user}: {synced.stderr}"
                rows = json.loads(_as(alice, team[alice], "jobs", "--json", db_url=db_url,
                                      IDMCTL_CLUSTER=str(profile)).stdout)
                return all(r["state"] == "COMPLETED" for r in rows if r["job"] in ids.values())

            wait_until(both_ended, 120, "both members' jobs to complete", poll_s=1.0)
            snapshots = sorted(p.name for p in (shared / "snapshots").iterdir())
            assert snapshots, "no snapshot in the shared store"
            owners = {(shared / "snapshots" / name).owner() for name in snapshots}
            # gc as bob: his own snapshot (if he wrote one) goes, alice's stays, listed, no traceback
            collected = _as(bob, team[bob], "gc", "--json", db_url=db_url, IDMCTL_CLUSTER=str(profile))
            assert collected.returncode == 0, collected.stderr
            report = json.loads(collected.stdout)
            assert not report["refused"], report
            left = sorted(p.name for p in (shared / "snapshots").iterdir())
            if alice in owners:
                assert any((shared / "snapshots" / name).owner() == alice for name in left)
                assert report["others"], report
            assert all((shared / "snapshots" / name).owner() != bob for name in left)


def _chain_status(db_url: str, chain: int) -> str:
    """The chain's status as the team's store holds it, read as the database's owner (not through idmctl)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT status FROM chain WHERE id = :id"), {"id": chain}).scalar_one()
    finally:
        engine.dispose()


def _job_row(db_url: str, job: int) -> dict:
    """The job's row as the team's store holds it, read as the database's owner (not through idmctl)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(text("SELECT * FROM job WHERE id = :id"), {"id": job}).mappings().one()
            return dict(row)
    finally:
        engine.dispose()


@contextmanager
def _controlled_profile() -> Iterator[Path]:
    """local-slurm with its controller job on (as tests/idmctl/ops/test_slurm_controller.py turns it on), in a
    folder every member can read."""
    import yaml

    folder = Path(tempfile.mkdtemp(prefix="idmctl-team-", dir="/home"))
    folder.chmod(0o755)
    profile = yaml.safe_load((REPO / "clusters" / "local-slurm.yaml").read_text())
    profile["controller"] = {**profile["controller"], "enabled": True}
    path = folder / "controlled.yaml"
    path.write_text(yaml.safe_dump(profile))
    path.chmod(0o644)
    try:
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("controlled", [False, True], ids=["member-syncs", "controller-jobs-sync"])
def test_a_members_preempted_job_is_requeued_and_resumes_from_her_own_checkpoint(team: dict[str, Path],
                                                                                  controlled: bool) -> None:
    """alice's job on the preemptible `sub` is preempted by bob's `core-own` job (both want all of n1's CPUs):
    Slurm signals it, it checkpoints into alice's run directory and Slurm requeues it; the next run resumes as
    alice from that checkpoint, and the preemption (the job's runs) and the resume are recorded: by alice's and
    bob's own syncs, or, with the controller on, by the controller jobs each attempt leaves behind, which run
    as the member on a compute node and reach the team's store with the member's own URL."""
    alice, bob = USERS
    # 30 s of steps: bob's submit as a separate process takes ~10 s (snapshot, admission, sbatch --test-only),
    # and the preemption must land while alice's first run is still going (24 steps of 0.3 s finished first).
    total = 120
    with fresh_database() as db_url, (_controlled_profile() if controlled else nullcontext()) as profile:
        env = {ENV_CLUSTER: str(profile)} if profile else {}
        done = _as(alice, team[alice], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "to be preempted", "--qos", "sub", "-c", "2", "--mem", "400MB", "--exclude", "n2", "-J", "alice-low",
                   "--json", db_url=db_url, IDMCTL_TEST_BEHAVIOR=f"steps:{total}:0.25", **env)
        assert done.returncode == 0, done.stderr
        low = json.loads(done.stdout)
        log, run_dir = Path(low["log"]), Path(low["script"]).parent
        # It starts once n1 is free: an earlier test's job on this worker's cluster may still be ending.
        wait_until(lambda: "entry: step 3" in text_so_far(log), 300,
                   lambda: f"3 steps of {alice}'s sub job {low['scheduler_id']} (squeue: "
                           f"{squeue_state(low['scheduler_id']) or 'gone'}; on n1: {_on_node('n1') or 'nothing'})")
        done = _as(bob, team[bob], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "preempts alice", "--qos", "core-own", "-c", "2", "--mem", "400MB", "--exclude", "n2", "-J", "bob-high",
                   "--json", db_url=db_url, IDMCTL_TEST_BEHAVIOR="steps:2:0.2", **env)
        assert done.returncode == 0, done.stderr
        high = json.loads(done.stdout)

        def ended() -> dict | None:
            release_requeued(low["scheduler_id"])
            for user in () if controlled else (alice, bob):  # each member's sync records that member's jobs
                synced = _as(user, team[user], "sync", db_url=db_url, **env)
                assert synced.returncode == 0, f"{user}: {synced.stderr}"
            rows = {r["job"]: r for r in json.loads(_as(alice, team[alice], "jobs", "--json", db_url=db_url,
                                                        **env).stdout)}
            finished = all(rows[j["job"]]["state"] in ("COMPLETED", "FAILED", "CANCELLED") for j in (low, high))
            return rows if finished else None

        rows = wait_until(ended, 240, lambda: f"both jobs to end: {text_so_far(log)[-1500:]}", poll_s=1.0)
        assert rows[high["job"]]["state"] == "COMPLETED" and rows[high["job"]]["user"] == bob
        mine = rows[low["job"]]
        assert (mine["state"], mine["user"], mine["chain"], mine["attempt"]) == ("COMPLETED", alice, low["chain"], 1), mine
        record = _job_row(db_url, low["job"])
        runs = record["runs"] if isinstance(record["runs"], list) else json.loads(record["runs"])
        assert mine["restarts"] >= 1, (mine, runs, log.read_text()[-2000:])  # Slurm requeued the same job
        assert runs[0]["state"] in ("PREEMPTED", "REQUEUED") and runs[-1]["state"] == "COMPLETED", runs
        committed = record["committed_step"] if isinstance(record["committed_step"], dict) else json.loads(record["committed_step"])
        assert committed["step"] == total, committed  # the chain's checkpoint as her sync read it at the end
        if controlled:  # every attempt's controller ran as its member and noted its run (after the sync it ran)
            def noted() -> list[dict] | None:
                now = {r["job"]: r for r in json.loads(_as(alice, team[alice], "jobs", "--json", db_url=db_url,
                                                           **env).stdout)}
                last = [(now[j["job"]]["controller"] or {}).get("last_run") for j in (low, high)]
                return last if all(last) else None

            notes = wait_until(noted, 60, "both members' controllers to note their runs", poll_s=1.0)
            assert all(note["ok"] for note in notes), notes
        ledger = _as(alice, team[alice], "ledger", "--user", alice, "--json", db_url=db_url, **env)
        assert ledger.returncode == 0, ledger.stderr
        # at least bob's (the shared cluster's other core-own jobs on n1 may preempt it again)
        assert json.loads(ledger.stdout)["total"]["preemptions"] >= 1, ledger.stdout
        text = log.read_text()
        assert re.search(r"entry: checkpointed at step \d+ on signal", text), text[-2000:]
        resumed = [int(s) for s in re.findall(r"entry: resumed from step (\d+)", text)]
        assert resumed and resumed[0] >= 3, text[-2000:]  # from her first run's checkpoint, not step 0
        assert f"entry: done {total} steps" in text
        # Everything the two runs wrote is alice's: her run directory, her checkpoint, her counters.
        for path in (run_dir, run_dir / "ckpt.json", run_dir / "steps_done.txt", log):
            assert path.owner() == alice, path
        assert int((run_dir / "steps_done.txt").read_text()) == total


def test_gc_removes_a_members_own_read_only_snapshot_and_a_colleagues_gc_leaves_it(team: dict[str, Path]) -> None:
    """Submit writes the code store's objects read-only (0444/0555: a hard link into a snapshot cannot be
    edited in place), and alice has frozen her snapshot's folders too (chmod -R a-w). gc as bob leaves all
    of it where it is; gc as alice, the owner, removes her unreferenced snapshot and every object of it."""
    alice, bob = USERS
    with _shared_code_store() as (shared, profile), fresh_database() as db_url:
        env = {ENV_CLUSTER: str(profile)}
        done = _as(alice, team[alice], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "gc of read-only objects", "--qos", "core-own", "--json", db_url=db_url, **env)
        assert done.returncode == 0, done.stderr
        submitted = json.loads(done.stdout)

        def ended() -> bool:
            synced = _as(alice, team[alice], "sync", db_url=db_url, **env)
            assert synced.returncode == 0, synced.stderr
            rows = json.loads(_as(alice, team[alice], "jobs", "--json", db_url=db_url, **env).stdout)
            return any(r["job"] == submitted["job"] and r["state"] == "COMPLETED" for r in rows)

        wait_until(ended, 120, f"{alice}'s job {submitted['scheduler_id']} to complete", poll_s=1.0)
        (snapshot,) = (shared / "snapshots").iterdir()
        objects = [p for p in (shared / "objects").rglob("*") if p.is_file()]
        assert objects and all(p.owner() == alice and not p.stat().st_mode & 0o222 for p in objects), objects
        size = sum(p.stat().st_size for p in objects)
        frozen = subprocess.run(["runuser", "-u", alice, "--", "chmod", "-R", "a-w", str(snapshot)],
                                capture_output=True, text=True)
        assert frozen.returncode == 0, frozen.stderr
        assert not snapshot.stat().st_mode & 0o222

        by_bob = _as(bob, team[bob], "gc", "--json", db_url=db_url, **env)
        assert by_bob.returncode == 0, by_bob.stderr
        report = json.loads(by_bob.stdout)
        assert (report["removed"], report["others"], report["refused"], report["freed_bytes"]) == (
            [], [snapshot.name], [], 0), report
        assert snapshot.is_dir() and all(p.exists() for p in objects)  # alice's, left as they were

        by_alice = _as(alice, team[alice], "gc", "--json", db_url=db_url, **env)
        assert by_alice.returncode == 0, by_alice.stderr
        report = json.loads(by_alice.stdout)
        assert (report["removed"], report["others"], report["refused"]) == ([snapshot.name], [], []), report
        assert report["freed_bytes"] == size, report
        assert not snapshot.exists()
        assert [p for p in objects if p.exists()] == []


def test_a_member_snapshots_into_the_shared_code_store_whose_folders_a_colleague_made(team: dict[str, Path]) -> None:
    """The first submit into a shared code store makes its ``snapshots/``, ``objects/<2 hex>/`` and ``envs/``
    folders; a colleague's submit of other code must still be able to write there (and not remove what the
    first one wrote). Each member freezes a code root of their own (a one-file package) as submit does."""
    alice, bob = USERS
    with _shared_code_store() as (shared, _):
        roots = {}
        for user, value in ((alice, 1), (bob, 2)):
            root = team[user] / "teamcode"
            root.mkdir()
            (root / "team_mod.py").write_text(f"VALUE = {value}\n")
            subprocess.run(["chown", "-R", f"{user}:{user}", str(root)], check=True)
            roots[user] = root
        made = {}
        for user in (alice, bob):
            code = ("import sys; from pathlib import Path; from ground.code_snapshot import materialize, record_environment, "
                    "tree; store = Path(sys.argv[2]); print(materialize(tree(Path(sys.argv[1])), store)); "
                    "record_environment(store)")
            done = subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"HOME=/home/{user}",
                                   f"PATH={os.environ['PATH']}", sys.executable, "-c", code, str(roots[user]),
                                   str(shared)], cwd=REPO, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{user}: {done.stderr}"
            made[user] = Path(done.stdout.split()[0])
        assert made[alice] != made[bob]
        for user in (alice, bob):
            assert made[user].owner() == user and (made[user] / "team_mod.py").read_text() == (roots[user] / "team_mod.py").read_text()
        # and neither can remove the other's: bob's rm of alice's snapshot fails, it stays whole
        removed = subprocess.run(["runuser", "-u", bob, "--", "rm", "-rf", str(made[alice])], capture_output=True)
        assert removed.returncode != 0 and (made[alice] / "team_mod.py").exists()


def _runbook_sql(first_line: str) -> str:
    """The runbook's ```sql block that starts with ``first_line``: the test runs what the operator is told to."""
    blocks = re.findall(r"```sql\n(.*?)```", (REPO / "runbook.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def _statements(sql: str, names: dict[str, str]) -> list[str]:
    """The block's statements with the runbook's names made this test's own, in one pass (a replacement is
    never replaced again): roles and the database by ``names``, a ``'ROLE-PASSWORD'`` by that role's password,
    ``('role', 'unix_user')`` pairs by the test's role and its Unix user."""
    def named(match: re.Match) -> str:
        if match.group("pair"):
            return f"('{names[match.group('role')]}', '{names['unix:' + match.group('unix')]}')"
        if match.group("password"):
            return f"'{names['password:' + match.group('password').lower()]}'"
        if match.group("database"):
            return f"DATABASE {names['idmctl']}"
        return names[match.group("name")]

    pattern = (r"(?P<pair>\('(?P<role>\w+)', '(?P<unix>\w+)'\))|'(?P<password>[A-Z]+)-PASSWORD'|(?P<database>DATABASE idmctl\b)"
               r"|\b(?P<name>idmctl_owner|idmctl_team|alice|bob)\b")
    text = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
    return [s.strip() for s in re.sub(pattern, named, text).split(";\n") if s.strip()]


@contextmanager
def _team_database() -> Iterator[dict[str, str]]:
    """The runbook's per-member roles on the test server, under names of this test's own: the roles and
    the database made by the first block (as the server's superuser, over its local socket), the store
    migrated by its owner, the grants and policies of the second block; everything dropped afterwards.
    Yields the URLs: ``owner``, and one per member (by Unix user)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from pg_support import server_url

    server = make_url(server_url())
    socket = Path(os.environ.get("IDMCTL_PG_ROOT", "/tmp/idmctl-pg")) / "run"
    if not socket.is_dir():
        pytest.skip(f"no PostgreSQL socket folder {socket} (scripts/postgres/up.sh makes it)")
    superuser = create_engine(f"postgresql+psycopg://postgres@/postgres?host={socket}&port={server.port}",
                              isolation_level="AUTOCOMMIT")
    tag = os.urandom(4).hex()
    alice, bob = USERS
    names = {"idmctl_owner": f"o_{tag}", "idmctl_team": f"team_{tag}", "alice": f"alice_{tag}",
             "bob": f"bob_{tag}", "idmctl": f"t_team_{tag}", "unix:alice": alice, "unix:bob": bob}
    names |= {f"password:{who}": os.urandom(8).hex() for who in ("owner", "alice", "bob")}

    def url(role: str, password: str) -> str:
        return server.set(username=role, password=password, database=names["idmctl"]).render_as_string(hide_password=False)

    urls = {"owner": url(names["idmctl_owner"], names["password:owner"]),
            alice: url(names["alice"], names["password:alice"]), bob: url(names["bob"], names["password:bob"])}
    try:
        with superuser.connect() as connection:
            for statement in _statements(_runbook_sql("-- team roles, as a superuser"), names):
                connection.execute(text(statement))
        yield {**urls, "names": names}  # type: ignore[misc]
    finally:
        with superuser.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{names["idmctl"]}" WITH (FORCE)'))
            for role in ("alice", "bob", "idmctl_team", "idmctl_owner"):
                connection.execute(text(f'DROP ROLE IF EXISTS "{names[role]}"'))
        superuser.dispose()


def _as_role(url: str, *statements: str, **params) -> list:
    """Run SQL as the URL's role (not through idmctl); the rowcount or rows of each statement."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            out = []
            for statement in statements:
                result = connection.execute(text(statement), params)
                out.append(result.all() if result.returns_rows else result.rowcount)
            return out
    finally:
        engine.dispose()


def test_per_member_database_roles_each_writes_their_own_rows_reads_all_and_cannot_change_a_colleagues(
        team: dict[str, Path]) -> None:
    """The runbook's team roles: a member's command on a store the owner has not migrated ends in one line;
    the owner's first command migrates; then alice and bob each submit and sync as their own login role, both
    see both jobs, ``jobs --user`` filters, and bob's SQL cannot change, remove or forge alice's rows."""
    from sqlalchemy.exc import ProgrammingError

    alice, bob = USERS
    with _team_database() as db:
        before = _as(alice, team[alice], "jobs", "--json", db_url=db[alice])
        assert before.returncode == 2, before.stdout + before.stderr
        where = db[alice].replace(f"{db['names']['alice']}:{db['names']['password:alice']}", "***")
        assert before.stderr == (  # one line, the password never printed, the fix the member can act on
            f"error: IDMCTL_DB_URL: cannot use the shared store (permission denied for schema public): {where} "
            "(ask the store's owner to run any idmctl command once with the owner's login (it migrates) and to "
            "grant your role (runbook: One role per member))\n"), before.stderr
        migrated = _as(alice, team[alice], "jobs", "--json", db_url=db["owner"])  # the owner's login, from anywhere
        assert migrated.returncode == 0 and json.loads(migrated.stdout) == [], migrated.stderr
        _as_role(db["owner"], *_statements(_runbook_sql("-- team grants, as idmctl_owner"), db["names"]))
        ids = {}
        for user in (alice, bob):
            done = _as(user, team[user], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                       "per-member roles", "--qos", "core-own", "--json", db_url=db[user])
            assert done.returncode == 0, f"{user}: {done.stderr}"
            ids[user] = json.loads(done.stdout)

        def both_ended() -> dict | None:
            for user in (alice, bob):
                synced = _as(user, team[user], "sync", db_url=db[user])
                assert synced.returncode == 0, f"{user}: {synced.stderr}"
            rows = {r["job"]: r for r in json.loads(_as(bob, team[bob], "jobs", "--json", db_url=db[bob]).stdout)}
            return rows if all(rows[i["job"]]["state"] == "COMPLETED" for i in ids.values()) else None

        rows = wait_until(both_ended, 120, "both members' jobs to complete", poll_s=1.0)
        assert {rows[ids[u]["job"]]["user"] for u in (alice, bob)} == {alice, bob}
        for user in (alice, bob):
            listed = json.loads(_as(bob, team[bob], "jobs", "--user", user, "--json", db_url=db[bob]).stdout)
            assert [r["job"] for r in listed] == [ids[user]["job"]], listed
        hers, his = ids[alice]["job"], ids[bob]["job"]
        # bob, as his role, against alice's rows: nothing changes, nothing goes, nothing is forged in her name
        assert _as_role(db[bob], "UPDATE job SET state = 'CANCELLED' WHERE id = :id",
                        "UPDATE chain SET status = 'CANCELLED' WHERE id = :chain",
                        "DELETE FROM job WHERE id = :id", id=hers, chain=ids[alice]["chain"]) == [0, 0, 0]
        with pytest.raises(ProgrammingError, match="row-level security"):
            _as_role(db[bob], "INSERT INTO job (experiment, attempt, executor, state, restarts, options_json, imported, "
                              "created_at, updated_at, \"user\") SELECT experiment, attempt, executor, state, restarts, "
                              "options_json, imported, created_at, updated_at, \"user\" FROM job WHERE id = :id", id=hers)
        assert _as_role(db[bob], "UPDATE job SET reason = 'his own' WHERE id = :id", id=his) == [1]  # his own: yes
        (row,) = _as_role(db["owner"], "SELECT job.state, chain.status FROM job JOIN chain ON chain.id = job.chain_id "
                                       "WHERE job.id = :id", id=hers)[0]
        assert tuple(row) == ("COMPLETED", "COMPLETED")
        # bob's `idmctl cancel` of alice's job: the policies refuse the chain's mark before scancel is tried
        done = _as(alice, team[alice], "submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason",
                   "bob may not cancel it", "--qos", "core-own", "--json", db_url=db[alice],
                   IDMCTL_TEST_BEHAVIOR="steps:600:0.2")
        assert done.returncode == 0, done.stderr
        long = json.loads(done.stdout)
        refused = _as(bob, team[bob], "cancel", str(long["job"]), db_url=db[bob])
        assert (refused.returncode, refused.stderr) == (
            1, f"error: cannot cancel job {long['job']}: it is {alice}'s, and the team's store lets only its owner change "
               "its chain (row-level security); nothing cancelled or recorded\n"), refused.stdout + refused.stderr
        assert squeue_state(long["scheduler_id"]) in ("PENDING", "RUNNING")
        (row,) = _as_role(db["owner"], "SELECT status FROM chain WHERE id = :id", id=long["chain"])[0]
        assert tuple(row) == ("ACTIVE",)
        own = _as(alice, team[alice], "cancel", str(long["job"]), db_url=db[alice])
        assert own.returncode == 0, own.stderr
        wait_until(lambda: squeue_state(long["scheduler_id"]) in ("", "CANCELLED", "COMPLETING"), 60,
                   f"{alice}'s job {long['scheduler_id']} to leave the queue after her own cancel")
