"""The store in dicts: :class:`~idmctl.record.store.JobStore`'s rules without a database, for the unit
tests that test what is done with records rather than how they are kept (Dagster's ``InMemoryRunStorage``
beside its SQL storage). Every behaviour runs against it and the SQL store in
``tests/idmctl/record/test_job_store.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone

from idmctl.core.job_state import JobState
from idmctl.record.records import (ChainRecord, ChainStatus, EvalLink, FailureRecord, FixRecord, JobRecord, NewFailure,
                                   NodeExclusionRecord)
from idmctl.record.moves import (Decision, newest_first, FACTS, ImportedJob, NewJob, Observation, SpecVersionRecord,
                                 TransitionRefused, UnknownRecord, claimant, merged)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryStore:
    """Jobs, chains, failures and exclusions in dicts; one lock makes each transition one transaction."""

    def __init__(self, user: str | None = None, host: str | None = None) -> None:
        self.user = user
        """Written as each row's ``user`` (the SQL store writes the process's writer)."""
        self.host = host
        """Written as each row's ``host``."""
        self._jobs: dict[int, JobRecord] = {}
        self._chains: dict[int, ChainRecord] = {}
        self._failures: dict[int, FailureRecord] = {}
        self._exclusions: list[NodeExclusionRecord] = []
        self._specs: dict[str, SpecVersionRecord] = {}
        self._fixes: dict[int, FixRecord] = {}
        self._lock = threading.Lock()

    # --- reads --------------------------------------------------------------------------------------------
    def job(self, job_id: int) -> JobRecord | None:
        return self._jobs.get(job_id)

    def chain(self, chain_id: int) -> ChainRecord | None:
        return self._chains.get(chain_id)

    def attempts(self, chain_id: int, before: int | None = None) -> list[JobRecord]:
        found = [j for j in self._jobs.values() if j.chain_id == chain_id and (before is None or j.attempt < before)]
        return sorted(found, key=lambda j: (j.attempt, j.id))

    def unfinished(self, chain_id: int | None = None, user: str | None = None) -> list[JobRecord]:
        return [j for j in sorted(self._jobs.values(), key=lambda j: j.id)
                if j.scheduler_id is not None and not j.is_terminal
                and (chain_id is None or j.chain_id == chain_id) and (user is None or j.user == user)]

    def eval_jobs(self, chain_id: int) -> list[JobRecord]:
        return [j for j in sorted(self._jobs.values(), key=lambda j: j.id)
                if j.eval_link is not None and j.eval_link.of_chain == chain_id]

    def failures(self, job_ids: Sequence[int]) -> list[FailureRecord]:
        wanted = set(job_ids)
        return [f for _, f in sorted(self._failures.items()) if f.job_id in wanted]

    def exclusions(self, reason: str | None = None) -> list[NodeExclusionRecord]:
        return [e for e in self._exclusions if reason is None or e.reason == reason]

    def with_scheduler_id(self, scheduler_id: str) -> list[JobRecord]:
        return [j for j in sorted(self._jobs.values(), key=lambda j: j.id) if j.scheduler_id == scheduler_id]

    def to_classify(self) -> list[JobRecord]:
        def stale(job: JobRecord) -> bool:
            times = [f.classified_at for f in self._failures.values() if f.job_id == job.id and f.classified_at]
            return not times or job.updated_at is None or max(times) < job.updated_at
        return [j for j in sorted(self._jobs.values(), key=lambda j: j.id)
                if (j.state_text != JobState.COMPLETED.value or j.restarts > 0) and stale(j)]

    def failure_table(self, experiment: str | None = None, cause: str | None = None, user: str | None = None,
                      newest: int | None = None) -> tuple[list[tuple[FailureRecord, JobRecord, FixRecord | None]], int]:
        pairs = [(f, self._jobs[f.job_id]) for _, f in sorted(self._failures.items())
                 if (cause is None or f.cause == cause) and f.job_id in self._jobs
                 and (not experiment or self._jobs[f.job_id].experiment == experiment)
                 and (not user or self._jobs[f.job_id].user == user)]
        total = len(pairs)
        if newest:
            pairs = newest_first(pairs, newest)
        return [(f, j, self._fixes.get(f.fix_id) if f.fix_id else None) for f, j in pairs], total

    # --- transitions ----------------------------------------------------------------------------------------
    def open_chain(self, experiment: str, spec_hash: str, retries: int,
                   spec: SpecVersionRecord | None = None) -> ChainRecord:
        with self._lock:
            if spec is not None:
                self._specs.setdefault(spec.hash, spec)
            chain = ChainRecord(id=max(self._chains, default=0) + 1, experiment=experiment, spec_hash=spec_hash,
                                status=ChainStatus.ACTIVE, retries_budget=retries, user=self.user, host=self.host,
                                created_at=_now())
            self._chains[chain.id] = chain
            return chain

    def withdrawn(self, chain_id: int) -> bool:
        with self._lock:
            if chain_id not in self._chains or any(j.chain_id == chain_id for j in self._jobs.values()):
                return False
            del self._chains[chain_id]
            return True

    def resumed(self, chain_id: int) -> ChainRecord:
        with self._lock:
            chain = self._chains.get(chain_id)
            if chain is None:
                raise UnknownRecord(f"no chain {chain_id} in the store")
            running = [j for j in self._jobs.values() if j.chain_id == chain_id and j.scheduler_id and not j.is_terminal]
            if running:
                raise TransitionRefused(f"chain {chain_id} is still running (job {running[-1].id}, {running[-1].state_text})")
            chain = self._chains[chain_id] = replace(chain, status=ChainStatus.ACTIVE)
            return chain

    def submitting(self, job: NewJob) -> JobRecord:
        with self._lock:
            chain = self._open_chain(job.chain_id)
            now = _now()
            record = JobRecord(id=len(self._jobs) + 1, experiment=job.experiment, state=JobState.SUBMITTING,
                               state_text=JobState.SUBMITTING.value, chain_id=chain.id, attempt=job.attempt,
                               spec_hash=job.spec_hash, code_version=job.code_version, preflight_id=job.preflight_id,
                               executor=job.executor, qos=job.qos, gpus=job.gpus, routing_n=job.routing_n,
                               script_path=job.script_path, options=dict(job.options), admitted=job.admitted,
                               code=job.code, eval_link=job.eval_link, forced_reason=job.forced_reason,
                               user=self.user, host=self.host, created_at=now, updated_at=now)
            self._jobs[record.id] = record
            return record

    def submitted(self, job_id: int, scheduler_id: str, log_path: str | None, at: datetime) -> JobRecord:
        with self._lock:
            job = self._in(job_id, {JobState.SUBMITTING}, "submitted")
            return self._put(replace(job, state=JobState.PENDING, state_text=JobState.PENDING.value,
                                     scheduler_id=scheduler_id, log_path=log_path, submitted_at=at))

    def refused(self, job_id: int, reason: str) -> JobRecord:
        with self._lock:
            job = self._in(job_id, {JobState.SUBMITTING}, "refused")
            self._close(job.chain_id, ChainStatus.FAILED)
            return self._put(replace(job, state=JobState.SUBMIT_FAILED, state_text=JobState.SUBMIT_FAILED.value,
                                     reason=reason[:500]))

    def observed(self, job_id: int, seen: Observation) -> JobRecord:
        with self._lock:
            job = self._running(job_id, "observed")
            if seen.state.is_terminal:
                raise TransitionRefused(f"job {job_id}: an end ({seen.state_text}) is recorded by `ended`, which claims it")
            return self._put(_with_observation(job, seen))

    def claim_end(self, job_id: int) -> bool:
        with self._lock:
            return self._claim(job_id)

    def ended(self, job_id: int, seen: Observation, failures: Sequence[NewFailure] = (),
              facts: Mapping[str, object] | None = None) -> JobRecord | None:
        with self._lock:
            job = self._running(job_id, "ended")
            if not seen.state.is_terminal:
                raise TransitionRefused(f"job {job_id}: {seen.state_text} is not an end (record it with `observed`)")
            if job.end_claim is None and not self._claim(job_id):
                return None
            job = self._jobs[job_id]
            if job.end_claim is not None and job.end_claim.by != claimant().by:
                return None
            job = replace(_with_observation(job, seen), **{k: v for k, v in (facts or {}).items()
                                                            if k in ("efficiency", "committed_step")})
            self._put(job)
            for failure in failures:
                self._write_failure(job_id, failure)
            return self._jobs[job_id]

    def record_failure(self, job_id: int, failure: NewFailure) -> FailureRecord:
        with self._lock:
            if job_id not in self._jobs:
                raise UnknownRecord(f"no job {job_id} in the store")
            return self._write_failure(job_id, failure)

    def classified(self, job_id: int, failures: Sequence[NewFailure]) -> list[FailureRecord]:
        with self._lock:
            if job_id not in self._jobs:
                raise UnknownRecord(f"no job {job_id} in the store")
            return [self._write_failure(job_id, failure) for failure in failures]

    def fixed(self, job_ids: Sequence[int], note: str, commit: str | None) -> FixRecord:
        with self._lock:
            fix = FixRecord(id=len(self._fixes) + 1, note=note, commit=commit, created_at=_now())
            self._fixes[fix.id] = fix
            for failure_id, failure in list(self._failures.items()):
                if failure.job_id in set(job_ids):
                    self._failures[failure_id] = replace(failure, fix_id=fix.id)
            return fix

    def decided(self, chain_id: int, decision: Decision) -> ChainRecord:
        with self._lock:
            chain = self._open_chain(chain_id)
            if decision.spend_retry:
                chain = replace(chain, retries_used=chain.retries_used + 1)
            if decision.close is not None:
                if not decision.close.is_terminal():
                    raise TransitionRefused(f"chain {chain_id}: {decision.close} does not close a chain")
                chain = replace(chain, status=decision.close)
            self._chains[chain_id] = chain
            self._exclusions.extend(decision.exclude)
            return chain

    def exclude_nodes(self, exclusions: Sequence[NodeExclusionRecord]) -> None:
        with self._lock:
            self._exclusions.extend(exclusions)

    def cancelling(self, job_id: int) -> tuple[JobRecord, ChainRecord | None]:
        with self._lock:
            job = self._running(job_id, "cancelling")
            if job.scheduler_id is None:
                raise TransitionRefused(f"job {job_id} was never submitted")
            chain = self._chains.get(job.chain_id) if job.chain_id is not None else None
            if chain is not None and chain.status is ChainStatus.ACTIVE:
                self._chains[chain.id] = replace(chain, status=ChainStatus.CANCELLED)
            return job, chain

    def cancel_refused(self, chain_id: int, previous: ChainStatus) -> ChainRecord | None:
        with self._lock:
            chain = self._chains.get(chain_id)
            if chain is not None and chain.status is ChainStatus.CANCELLED:
                self._chains[chain_id] = replace(chain, status=previous)
            return self._chains.get(chain_id)

    def note(self, job_id: int, key: str, value: object) -> JobRecord:
        if key not in FACTS:
            raise KeyError(f"{key!r} is not a job fact ({', '.join(FACTS)})")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownRecord(f"no job {job_id} in the store")
            self._jobs[job_id] = replace(job, **{key: merged(getattr(job, key), value)})
            return self._jobs[job_id]

    def relinked(self, job_id: int, link: EvalLink) -> JobRecord:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownRecord(f"no job {job_id} in the store")
            if job.eval_link is None or job.eval_link.of_chain != link.of_chain:
                raise TransitionRefused(f"job {job_id} is not an eval job of chain {link.of_chain}")
            self._jobs[job_id] = replace(job, eval_link=link)
            return self._jobs[job_id]

    def note_chain_run(self, chain_id: int, mlflow_run_id: str) -> ChainRecord:
        with self._lock:
            chain = self._chains.get(chain_id)
            if chain is None:
                raise UnknownRecord(f"no chain {chain_id} in the store")
            if not chain.mlflow_run_id:
                chain = self._chains[chain_id] = replace(chain, mlflow_run_id=mlflow_run_id)
            return chain

    def imported(self, jobs: Sequence[ImportedJob],
                 classify: Callable[[JobRecord], Sequence[NewFailure]]) -> list[tuple[JobRecord, list[FailureRecord]]]:
        with self._lock:
            known = {job.scheduler_id for job in self._jobs.values()}
            added = []
            for new in jobs:
                if new.scheduler_id in known:
                    continue
                known.add(new.scheduler_id)
                state = JobState.stored(new.state_text)
                if state is None:
                    raise TransitionRefused(f"job {new.scheduler_id}: {new.state_text!r} is not a job state")
                now = _now()
                record = JobRecord(id=len(self._jobs) + 1, experiment=new.experiment, state=state,
                                   state_text=new.state_text, scheduler_id=new.scheduler_id, reason=new.reason,
                                   exit_code=new.exit_code, derived_exit_code=new.derived_exit_code,
                                   submitted_at=new.submitted_at, started_at=new.started_at, ended_at=new.ended_at,
                                   node_list=new.node_list, restarts=new.restarts, qos=new.qos, gpus=new.gpus,
                                   log_path=new.log_path, log_tail=new.log_tail, imported=True,
                                   user=new.user or self.user, host=self.host, created_at=now, updated_at=now)
                self._jobs[record.id] = record
                added.append((record, [self._write_failure(record.id, found) for found in classify(record)]))
            return added

    def claim_notice(self, job_id: int, event: str) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or event in job.notified:
                return False
            self._jobs[job_id] = replace(job, notified={**job.notified, event: _now().isoformat(timespec="seconds")})
            return True

    # --- the rules ------------------------------------------------------------------------------------------
    def _put(self, job: JobRecord) -> JobRecord:
        self._jobs[job.id] = replace(job, updated_at=_now())
        return self._jobs[job.id]

    def _in(self, job_id: int, states: set[JobState], move: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownRecord(f"no job {job_id} in the store")
        if job.state not in states:
            raise TransitionRefused(f"job {job_id} is {job.state_text}: `{move}` moves only a job that is "
                                    f"{' or '.join(sorted(states))}")
        return job

    def _running(self, job_id: int, move: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownRecord(f"no job {job_id} in the store")
        if job.is_terminal:
            raise TransitionRefused(f"job {job_id} already ended {job.state_text}: `{move}` never leaves a terminal state")
        return job

    def _open_chain(self, chain_id: int) -> ChainRecord:
        chain = self._chains.get(chain_id)
        if chain is None:
            raise UnknownRecord(f"no chain {chain_id} in the store")
        if chain.status.is_terminal():
            raise TransitionRefused(f"chain {chain_id} is {chain.status}: a chain that is over takes no more")
        return chain

    def _close(self, chain_id: int | None, status: ChainStatus) -> None:
        chain = self._chains.get(chain_id) if chain_id is not None else None
        if chain is not None and not chain.status.is_terminal():
            self._chains[chain.id] = replace(chain, status=status)

    def _claim(self, job_id: int) -> bool:
        job = self._jobs.get(job_id)
        if job is None or job.end_claim is not None:
            return False
        self._jobs[job_id] = replace(job, end_claim=claimant())
        return True

    def _write_failure(self, job_id: int, failure: NewFailure) -> FailureRecord:
        run = failure.detail.get("run", 1)
        same = [f for f in self._failures.values() if f.job_id == job_id and f.run == run]
        found = FailureRecord(id=same[0].id if same else len(self._failures) + 1, job_id=job_id, cause=failure.cause,
                              evidence=failure.evidence, detail=dict(failure.detail),
                              fix_id=same[0].fix_id if same else None, classified_at=_now(), user=self.user)
        self._failures[found.id] = found
        return found


def _with_observation(job: JobRecord, seen: Observation) -> JobRecord:
    return replace(job, state=seen.state, state_text=seen.state_text, reason=seen.reason, exit_code=seen.exit_code,
                   submitted_at=seen.submitted_at, started_at=seen.started_at, ended_at=seen.ended_at,
                   node_list=seen.node_list, restarts=seen.restarts, runs=tuple(seen.runs), log_tail=seen.log_tail)
