"""Check ``qos``: the job fits its QoS tier — GPU cap, max wall, a preempt cycle long enough to
stage in and reach a checkpoint (card jobs 6054/6108/6158: 1 h cycle < 2 h stage → preempted ×3),
a tolerable expected queue wait from recorded jobs (card job 5961: 6 days for 8 GPUs on
core-extra, then cancelled), and an account the cluster takes: one when the profile requires it, with an
association granting the QoS where ``sacctmgr show assoc`` is readable (``idmctl.gate.assoc``)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

from idmctl.plan.budget import fmt_bandwidth, fmt_seconds, routed_staging_fix, stage_attempts, staging, step_estimate
from idmctl.plan.limits import derive
from idmctl.core.checks import CheckResult, PreflightContext, QueueWait, Status
from ground.units import format_duration
from idmctl.gate.assoc import read as read_associations
from idmctl.gate.cluster_settings import cluster_texts as read_cluster_texts, parse_config, preemption_notice

if TYPE_CHECKING:
    from ground.spec.schema import ResourcesSpec
    from idmctl.core.profile import ClusterProfile
    from idmctl.plan.budget import Staging
    from idmctl.plan.limits import Limits

NAME = "qos"
LONG_QUEUE_WAIT_S = 86400.0
"""Default of a profile's ``queue_wait_warn``: the card's job 5961 sat 6 days before anyone switched quota."""


def check(ctx: PreflightContext) -> CheckResult:
    spec, profile = ctx.spec, ctx.profile
    res = spec.resources
    if res.qos not in profile.qos:
        return CheckResult(NAME, Status.FAIL, f"QoS {res.qos!r} does not exist on cluster {profile.name}",
                           {}, f"use one of: {', '.join(profile.qos)}")
    tier = profile.qos[res.qos]
    gpus = res.gpus_per_node * res.nodes
    fails: list[str] = []
    warns: list[str] = []
    fixes: list[str] = []
    notes: list[str] = []
    limits = derive(ctx)
    time_limit = res.time_limit or f"{limits.time_limit_slurm} (derived)"
    numbers: dict[str, object] = {"qos": res.qos, "gpus": gpus, "max_gpus": tier.max_gpus,
                                  "time_limit_s": limits.time_limit.effective, "max_wall_s": tier.max_wall_seconds,
                                  "checkpoint_every": int(limits.checkpoint_every.effective),
                                  "checkpoint_work_s": limits.checkpoint_every.effective * limits.step_s,
                                  "step_provenance": limits.step_provenance.as_dict()}

    if tier.max_gpus is not None and gpus > tier.max_gpus:
        fails.append(f"{gpus} GPUs > {res.qos} max {tier.max_gpus}")
        fixes.append(f"ask for ≤ {tier.max_gpus} GPUs or another QoS")
    else:
        notes.append(f"{gpus} GPUs ≤ max {tier.max_gpus if tier.max_gpus is not None else 'unlimited'}")
    if limits.time_limit.effective > tier.max_wall_seconds:
        fails.append(f"time_limit {time_limit} > {res.qos} max wall {tier.max_wall}")
        fixes.append(f"set resources.time_limit ≤ {tier.max_wall}")
    else:
        notes.append(f"time_limit {time_limit} ≤ max wall {tier.max_wall}")

    cycle = tier.preempt_cycle_seconds if tier.preemptible else None
    if cycle is not None:
        stage, estimate = staging(ctx), step_estimate(ctx)
        every = int(limits.checkpoint_every.effective)
        checkpoint_s = every * estimate.step_s
        first_checkpoint = stage.seconds + checkpoint_s
        numbers.update(preempt_cycle_s=cycle, stage_s=stage.seconds, stage_bytes=stage.bytes,
                       checkpoint_interval_s=checkpoint_s, first_checkpoint_s=first_checkpoint)
        stage_text = (f"stage-in {stage.copied} ÷ NAS {fmt_bandwidth(profile.storage.nas_read_bps)} = "
                      f"{format_duration(stage.seconds)}" if stage.enabled else "no stage-in")
        if stage.reused:
            stage_text = f"stage-in 0 s (already staged at {spec.stage.dest} with this key)"
        restage_text = _restaging(ctx, stage, estimate.train_s, numbers)
        if restage_text:
            stage_text += f" on every attempt ({stage.restaged})"
        ckpt_text = (f"checkpoint every {every:,} steps{'' if spec.train.checkpoint_every else ' (derived)'} × "
                     f"{fmt_seconds(estimate.step_s)}/step"
                     f"{'' if estimate.provenance.measured else ' (' + estimate.provenance.label + ')'} = "
                     f"{format_duration(checkpoint_s)}")
        # Card jobs 6054/6108/6158 staged all 12 layers; staging only the routed ones may fit the cycle.
        routed_fix = routed_staging_fix(ctx, lambda routed: routed.seconds < cycle)
        if routed_fix:
            left = cycle - staging(ctx, "routed").seconds
            routed_fix += f" < preempt cycle {format_duration(cycle)}"
            if checkpoint_s >= left:
                # Staging alone fitting is not a PASS: the first checkpoint must land inside the cycle too.
                fit_every = max(1, int(left / estimate.step_s) - 1) if estimate.step_s > 0 else every
                routed_fix += (f", and checkpoint within the {format_duration(left)} left: train.checkpoint_every ≤ "
                               f"{fit_every:,} steps ({fit_every:,} × {fmt_seconds(estimate.step_s)}/step)")
        if stage.enabled and stage.seconds >= cycle:
            fails.append(f"preemptible {res.qos}: {stage_text} ≥ preempt cycle {format_duration(cycle)}: preempted "
                         "before the first step, every attempt" + (", the copy starting over each time" if restage_text else ""))
            fixes.extend([routed_fix] if routed_fix else [])
            fixes.append("use a non-preemptible QoS (own/extra quota) for long-staging jobs")
        elif first_checkpoint >= cycle:
            fails.append(f"preemptible {res.qos}: {stage_text} + {ckpt_text} = {format_duration(first_checkpoint)} ≥ "
                         f"preempt cycle {format_duration(cycle)}: no checkpoint survives a preemption")
            fixes.extend([routed_fix] if routed_fix else [])
            fixes.append("checkpoint more often (train.checkpoint_every) or use a non-preemptible QoS")
        else:
            notes.append(f"{stage_text} + {ckpt_text} < preempt cycle {format_duration(cycle)}")
        if restage_text and stage.seconds < cycle:  # the run's stage-ins, each attempt's own copy counted
            notes.append(restage_text)
        notice_status, notice_text, notice_fix = _preemption_notice(res, profile, limits, checkpoint_s, cycle, numbers)
        if notice_status:
            (fails if notice_status == Status.FAIL else warns).append(notice_text)
            fixes.append(notice_fix)
        elif notice_text:
            notes.append(notice_text)
    elif spec.stage.enabled:  # a non-preemptible tier: a run longer than its max wall restages in each attempt
        restage_text = _restaging(ctx, staging(ctx), step_estimate(ctx).train_s, numbers)
        if restage_text:
            (fails if numbers["stage_attempts"] == float("inf") else notes).append(restage_text)

    account_fail, account_fix, account_note = _account(res, profile, numbers)
    if account_fail:
        fails.append(account_fail)
        fixes.append(account_fix)
    elif account_note:
        notes.append(account_note)

    wait_text, wait_warn, wait_fix, wait_numbers = _queue_wait(ctx.measurements.queue_waits, res.qos, gpus,
                                                               profile.queue_wait_warn_seconds)
    numbers.update(wait_numbers)
    if wait_warn:
        warns.append(wait_text)
        fixes.append(wait_fix)
    else:
        notes.append(wait_text)

    # The finish date with its range, before submit: the waits above and the tier's preemptions (plan/forecast).
    from idmctl.plan.forecast import finish_note  # start-up: numpy, only where a preflight runs

    finish, numbers["finish_forecast"] = finish_note(ctx, limits, tier, gpus)
    notes.append(finish)

    if limits.checkpoint_warning:
        warns.append(limits.checkpoint_warning)
        fixes.append(f"set train.checkpoint_every: {int(limits.checkpoint_every.derived):,} or leave it unset to "
                     f"derive it ({limits.checkpoint_every.arithmetic})")
    if fails:
        return CheckResult(NAME, Status.FAIL, "; ".join(fails + warns + notes), numbers, "; ".join(fixes))
    if warns:
        return CheckResult(NAME, Status.WARN, "; ".join(warns + notes), numbers, "; ".join(fixes))
    return CheckResult(NAME, Status.PASS, f"{res.qos}: " + "; ".join(notes), numbers)


def _preemption_notice(res: "ResourcesSpec", profile: "ClusterProfile", limits: "Limits", checkpoint_s: float,
                       cycle: float, numbers: dict[str, object]) -> tuple[Status | None, str, str]:
    """(status, text, fix): whether a preempted job of this tier can checkpoint and go on, from the cluster's
    own settings (``cluster_settings``: the user signal at preemption, the tier's GraceTime), read only on the
    cluster the profile names; status None means a note.

    Without send_user_signal a preemption with a GraceTime sends TERM to the job's tasks, never its USR1 to
    the batch script (seen on the local 22.05 cluster): the trainer checkpoints and exits, but the job script
    takes TERM for a cancel and does not requeue, so the job ends FAILED 75 before Slurm's own requeue at the
    end of the grace. A job whose time limit is longer than the tier's preempt cycle meets that: FAIL. A
    shorter one may never be preempted: WARN. A grace shorter than step + write loses the steps since the
    last periodic checkpoint, which the preempt-cycle check above bounds, and Slurm still requeues the job:
    WARN, signal or not."""
    if profile.scheduler != "slurm" or not profile.slurm_cluster:
        return None, "preemption notice not read (the profile names no slurm_cluster to ask)", ""
    config = parse_config(read_cluster_texts()[0])
    if not config:
        return None, "preemption notice not read (Slurm does not answer here)", ""
    if config.get("ClusterName") != profile.slurm_cluster:
        return None, (f"preemption notice not read (Slurm here is cluster {config.get('ClusterName')!r}, the "
                      f"profile's is {profile.slurm_cluster!r})"), ""
    notice = preemption_notice(res.qos, res.partition)
    if notice is None:
        return None, "preemption notice not read (Slurm does not answer here)", ""
    write_s = limits.write_s
    need = limits.step_s + (write_s or 0.0)
    need_text = (f"step {fmt_seconds(limits.step_s)} + write "
                 f"{fmt_seconds(write_s) if write_s is not None else 'unmeasured'} = {fmt_seconds(need)}")
    numbers.update(preempt_signalled=notice.signalled, preempt_grace_s=notice.grace_s, preempt_save_need_s=need)
    if notice.grace_s < need:
        return (Status.WARN,
                f"preemptible {res.qos}: no checkpoint on preemption here ({notice.source} < {need_text}): each "
                f"preemption loses the steps since the last checkpoint, up to {format_duration(checkpoint_s)} "
                f"(half on average)",
                f"ask the admins for a GraceTime ≥ {fmt_seconds(need * 3)} on {res.qos}, or use a non-preemptible "
                "QoS; checkpointing more often shortens the loss")
    if not notice.signalled:
        time_limit = limits.time_limit.effective
        said = (f"preemptible {res.qos}: a preemption here sends TERM, not the job's USR1 ({notice.source}): the "
                "trainer checkpoints, but the job script takes TERM for a cancel and does not requeue, so the job "
                "ends FAILED 75 and the chain stops")
        fix = ("ask the admins for SlurmctldParameters=preempt_send_user_signal (Slurm ≥ 23.02: "
               "PreemptParameters=send_user_signal), or use a non-preemptible QoS")
        if time_limit > cycle:
            return (Status.FAIL, f"{said}; time_limit {format_duration(time_limit)} > preempt cycle "
                    f"{format_duration(cycle)}: expect a preemption before the job ends",
                    f"{fix}, or a time_limit ≤ {format_duration(cycle)}")
        return (Status.WARN, f"{said} (time_limit {format_duration(time_limit)} ≤ preempt cycle "
                f"{format_duration(cycle)}: only if preempted sooner than the cycle)", fix)
    return None, (f"a preemption sends its USR1 and leaves {fmt_seconds(notice.grace_s)} to save ≥ {need_text} "
                  f"({notice.source})"), ""


def _restaging(ctx: PreflightContext, stage: "Staging", train_s: float, numbers: dict[str, object]) -> str:
    """The per-attempt stage-in line (``budget.stage_attempts``) when no copy outlives the job; empty otherwise."""
    if not stage.restaged:
        return ""
    attempts, text = stage_attempts(ctx, stage, train_s)
    numbers.update(stage_restaged=stage.restaged, stage_attempts=attempts, stage_total_s=stage.seconds * attempts)
    return text


def _account(res: "ResourcesSpec", profile: "ClusterProfile", numbers: dict[str, object]) -> tuple[str, str, str]:
    """(fail, fix, note): the job's account against the profile's requirement and the user's associations
    (``sacctmgr show assoc``, where readable: ``idmctl.gate.assoc``)."""
    account = res.account or profile.account
    numbers["account"] = account
    if account is None and profile.account_required:
        return (f"no account: cluster {profile.name} refuses a job without one (profile account_required)",
                "set resources.account or pass --account (`sacctmgr show assoc user=$USER` lists yours)", "")
    assoc = read_associations(profile.slurm_cluster)
    if assoc.unread is not None:
        return "", "", f"associations not read ({assoc.unread})" if account else ""
    judged = account or assoc.default_account
    numbers.update(assoc_accounts=assoc.accounts, assoc_default_account=assoc.default_account)
    if judged is None:
        return "", "", "no account asked and none by default"
    if judged not in assoc.accounts:
        return (f"account {judged!r}: {assoc.user} has no association with it on {profile.slurm_cluster} "
                f"(sacctmgr show assoc: {', '.join(assoc.accounts) or 'none'})",
                f"use --account {' or '.join(assoc.accounts)}" if assoc.accounts else "ask the cluster's admins for an association", "")
    granted = assoc.qos_of(judged, res.partition)
    numbers["assoc_qos"] = granted
    if res.qos not in granted:
        return (f"QoS {res.qos!r} is not granted to {assoc.user} under account {judged} (sacctmgr show assoc: "
                f"{', '.join(granted) or 'none'})", f"use one of: {', '.join(granted)}" if granted else
                "ask the cluster's admins for the QoS", "")
    return "", "", f"account {judged}{'' if account else ' (default)'} grants {res.qos} (sacctmgr show assoc)"


def _queue_wait(waits: list[QueueWait], qos: str, gpus: int,
                long_wait_s: float = LONG_QUEUE_WAIT_S) -> tuple[str, bool, str, dict[str, object]]:
    by_qos: dict[str, list[QueueWait]] = defaultdict(list)
    for wait in waits:
        if wait.gpus == gpus:
            by_qos[wait.qos].append(wait)
    same = by_qos.get(qos, [])
    if not same:
        return f"no recorded {gpus}-GPU jobs on {qos} to estimate the queue wait", False, "", {"expected_wait_s": None}
    expected = statistics.median(w.seconds for w in same)
    cancelled = sum(w.cancelled_while_pending for w in same)
    detail = ", ".join(f"{w.scheduler_id} {format_duration(w.seconds)}{' (cancelled while pending)' if w.cancelled_while_pending else ''}"
                       for w in same[:5])
    text = (f"expected queue wait {format_duration(expected)} = median of {len(same)} recorded {gpus}-GPU {qos} "
            f"job(s): {detail}")
    numbers = {"expected_wait_s": expected, "history_jobs": len(same), "cancelled_while_pending": cancelled}
    if expected <= long_wait_s:
        return text, False, "", numbers
    others = sorted((statistics.median(w.seconds for w in rows), name) for name, rows in by_qos.items() if name != qos)
    better = [f"{name}: median {format_duration(m)} over {len(by_qos[name])} job(s)" for m, name in others if m < expected]
    fix = ("consider " + "; ".join(better)) if better else "switch quota (e.g. own QoS) or ask for fewer GPUs"
    return f"long: {text} > {format_duration(long_wait_s)} (cluster queue_wait_warn)", True, fix, numbers
