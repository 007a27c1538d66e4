"""``idmctl report EXP…``: the lab's progress card, written from the record instead of by hand.

Card A's sections, each from where idmctl keeps it — nothing here is configured or typed twice:
- TL;DR: the chain's state (the store's newest job) and the goal's decision with its interval (decide);
- the plan's arithmetic: the newest preflight's checks, each figure with the arithmetic and source it
  was recorded with (preflight keeps them);
- every attempt: the store's jobs; a failed one with its cause, evidence, the fix recorded and the check
  that catches it now (the ``failures`` table, card A's);
- GPU-hours charged / useful / lost (the ``ledger``);
- the baselines under their protocols (baselines.yaml and imported evaluations), a point estimate said so;
- what is still open: jobs not ended, failures without a fix, an UNDECIDED goal and what would decide it.

Markdown is the card; ``--html`` is the same card in one self-contained file with its plots embedded
(PNG as data: URIs, matplotlib). Heavy modules (sqlalchemy, mlflow, matplotlib) load inside the functions.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ground.errors import UserError
from ground.units import format_duration
from idmctl.core.job_state import JobState
from idmctl.record.records import JobRecord


@dataclass
class Card:
    """Everything one card shows, as markdown lines per section (and the figures for ``--html``)."""

    title: str
    experiments: list[str]
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    """(heading, markdown lines)."""
    figures: list[tuple[str, bytes]] = field(default_factory=list)
    """(caption, PNG bytes): drawn only for ``--html``."""
    open_items: list[str] = field(default_factory=list)
    decisions: list[Any] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        for heading, body in self.sections:
            lines += [f"## {heading}", "", *body, ""]
        return "\n".join(lines).rstrip() + "\n"

    def html(self) -> str:
        """One file: the markdown's sections as HTML (tables kept as tables), the figures embedded."""
        parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>",
                 "<style>body{font-family:sans-serif;max-width:72em;margin:2em auto}table{border-collapse:collapse}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}code{background:#f4f4f4}</style></head><body>",
                 f"<h1>{html.escape(self.title)}</h1>"]
        for heading, body in self.sections:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
            parts.append(_html_block(body))
        if self.figures:
            parts.append("<h2>Figures</h2>")
        for caption, png in self.figures:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"


def _html_block(lines: list[str]) -> str:
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if not table:
            return
        head, *rows = table
        out.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>")
        for row in rows:
            out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        out.append("</table>")
        table.clear()

    for line in lines:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                table.append(cells)
            continue
        flush()
        if line.startswith("- "):
            out.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.startswith("### "):
            out.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _hours(seconds: float | None) -> str:
    return "—" if seconds is None else format_duration(seconds)


# ------------------------------------------------------------------------------------------ sections

def _jobs(experiments: list[str]) -> list[JobRecord]:
    from idmctl.record.card import jobs_of  # start-up: record's session loads SQLAlchemy on first use

    return jobs_of(experiments)


def _attempts(jobs: list[JobRecord], failures: dict[str, Any]) -> list[str]:
    if not jobs:
        return ["No job has been submitted yet."]
    lines = ["| job | experiment | chain / attempt | qos | GPUs | state | queued | ran | cause | fix | caught now by |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for job in jobs:
        waited = (job.started_at or job.ended_at) - job.submitted_at if job.submitted_at and (job.started_at or job.ended_at) else None
        ran = job.ended_at - job.started_at if job.started_at and job.ended_at else None
        row = failures.get(job.scheduler_id or "")
        chain = f"{job.chain_id} / {job.attempt}" if job.chain_id else "—"
        fix = (row.fix or f"open — suggested: {row.suggested_fix}") if row is not None else "—"
        lines.append("| " + " | ".join(_cell(c) for c in (
            job.scheduler_id or job.id, job.experiment, chain, job.qos or "—", job.gpus if job.gpus is not None else "—",
            job.state_text, _hours(waited.total_seconds() if waited else None), _hours(ran.total_seconds() if ran else None),
            row.cause if row is not None else "—", fix, row.caught_by if row is not None else "—")) + " |")
    return lines


def _failure_rows(experiments: list[str]) -> list[Any]:
    from idmctl.ops.failures.postmortem import classify_and_read  # start-up: pulls sqlalchemy and pydantic

    rows: list[Any] = []
    for experiment in experiments:
        rows += classify_and_read(experiment=experiment)[0]
    return sorted(rows, key=lambda r: (r.ended_at is None, r.ended_at, r.job))


def _gpu_hours(experiments: list[str]) -> tuple[list[str], Any]:
    from idmctl.ops.ledger import ledger, run_costs_stored  # start-up: pulls yaml

    costs = [c for c in run_costs_stored() if c.experiment in experiments]
    if not costs:
        return ["No run has ended: nothing charged yet."], None
    _, total = ledger(costs, "experiment")
    lost = ", ".join(f"{cause} {hours:.2f}" for cause, hours in sorted(total.lost_h.items(), key=lambda kv: -kv[1]))
    lines = ["| GPU-h charged | GPU-h useful | GPU-h lost | lost to | preemptions | lost per preemption |",
             "|---|---|---|---|---|---|",
             f"| {total.charged_h:.2f} | {total.useful_h:.2f} | {total.lost_total_h:.2f} | {lost or '—'} | "
             f"{total.preemptions} | " + (f"{total.per_preemption_h:.2f}" if total.per_preemption_h is not None else "—") + " |",
             "",
             f"Source: the store's {total.runs} ended runs (`idmctl ledger --by experiment`): charged = GPUs × the time "
             "each run held them; useful = up to the last checkpoint a later run used."]
    return lines, total


def _plan(experiments: list[str]) -> list[str]:
    from idmctl.record.card import newest_preflight  # start-up: record's session loads SQLAlchemy on first use

    lines: list[str] = []
    for experiment in experiments:
        found = newest_preflight(experiment)
        if found is None:
            lines.append(f"{experiment}: no preflight recorded (run `idmctl preflight {experiment}`).")
            continue
        run, checks = found
        verdict = "PASS" if run.passed else ("static only" if not run.with_smoke else "FAIL")
        lines += [f"### {experiment}: preflight {run.id} ({verdict}, spec {run.spec_hash[:12]}, code "
                  f"{(run.code_version or '')[:12]}, cluster {run.profile_name}, {run.started_at:%Y-%m-%d %H:%M})", "",
                  "| check | status | figure, arithmetic and source |", "|---|---|---|"]
        for check in checks:
            lines.append(f"| {_cell(check.name)} | {check.status} | {_cell(check.summary)} |")
        lines.append("")
    return lines


def _finish(experiments: list[str], jobs: list[JobRecord]) -> list[str]:
    """The finish date's P10 / P50 / P90 for the steps still to train, from the store's history on the
    spec's QoS × GPU count (``idmctl.plan.forecast``), with what it rests on."""
    from ground.spec import load_spec  # start-up: pulls pydantic and yaml
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic
    from idmctl.plan.forecast import Plan, forecast, history_from_jobs, lines as forecast_lines  # start-up: numpy
    from idmctl.plan.limits import limits_for  # start-up: pulls pydantic and yaml
    from idmctl.record.card import ended_jobs  # start-up: record's session loads SQLAlchemy on first use

    out: list[str] = []
    history = history_from_jobs(ended_jobs())
    profile, _ = load_profile(None)
    for experiment in experiments:
        try:
            resolved = load_spec(experiment)
        except UserError as exc:
            out.append(f"{experiment}: no spec to plan from ({exc.what})")
            continue
        spec = resolved.spec
        done = max([int((j.committed_step or {}).get("step") or 0) for j in jobs if j.experiment == experiment
                    and isinstance(j.committed_step, Mapping)] or [0])
        if any(j.experiment == experiment and j.state is JobState.COMPLETED and j.chain_id for j in jobs):
            out.append(f"{experiment}: a chain completed; nothing left to forecast")
            continue
        limits = limits_for(resolved, profile)
        steps = max(0, spec.train.steps - done)
        stage_s = max(0.0, limits.wall_s - spec.train.steps * limits.step_s)
        tier = profile.qos.get(spec.resources.qos)
        plan = Plan(steps=steps, step_s=limits.step_s, checkpoint_every=max(1, int(limits.checkpoint_every.effective)),
                    stage_in_s=stage_s, qos=spec.resources.qos, gpus=spec.resources.nodes * spec.resources.gpus_per_node,
                    preemptible=bool(tier and tier.preemptible), step_source=limits.step_source)
        out += [f"### {experiment}: {steps:,} of {spec.train.steps:,} steps to go on {plan.qos} × {plan.gpus} GPU "
                f"(cluster profile {profile.name})", ""]
        out += [f"- {line.strip()}" for line in forecast_lines(forecast(plan, history))] + [""]
    return out


def _parameters(experiments: list[str]) -> list[str]:
    """Parameters by part, counted on the model the spec builds (meta device: no memory, instant at full
    size — ``idmctl model summary``), card A's rounded figures beside when the shape is the card's."""
    from ground.spec import load_spec  # start-up: pulls pydantic and yaml

    lines = ["| experiment | DiT blocks | KV projectors | action encoder/decoder, timestep | total | card A (N=4) |",
             "|---|---|---|---|---|---|"]
    for experiment in experiments:
        try:
            resolved = load_spec(experiment)
            from trainers.registry import CARD_PARAMS_N4, CARD_SHAPE, build_model, parameter_table  # heavy: torch

            params = parameter_table(build_model(resolved.spec, device="meta"))
        except UserError as exc:
            lines.append(f"| {experiment} | — | — | — | — | the spec's model could not be built: {_cell(exc.what)} |")
            continue
        shape = (resolved.spec.data.routing_n, resolved.spec.model.depth) == CARD_SHAPE
        card = (" / ".join(f"{CARD_PARAMS_N4[k] / 1e6:.1f}M" for k in ("dit", "kv_projectors", "action_io", "total"))
                + " (the card's, rounded)") if shape else "another shape"
        lines.append(f"| {experiment} | " + " | ".join(f"{params[k]:,}" for k in ("dit", "kv_projectors", "action_io", "total"))
                     + f" | {card} |")
    return lines


def _baselines() -> list[str]:
    from idmctl.track.compare import load_baselines  # start-up: the card's sections load the store/track modules only when drawn

    rows = load_baselines()
    if not rows:
        return ["No baselines recorded (experiments/baselines.yaml, `idmctl eval import`)."]
    lines = ["| baseline | metric | value | protocol | evidence |", "|---|---|---|---|---|"]
    for row in rows:
        for metric, summary in sorted(row.metrics.items()):
            if row.evaluation is not None:
                evidence = (f"{row.evaluation.rows} per-episode results ({row.evaluation.source.rsplit('/', 1)[-1]}, "
                            f"sha256 {row.evaluation.sha256[:12]})")
            else:
                evidence = "a mean only: a point estimate without a spread"
            lines.append(f"| {_cell(row.label)} | {metric} | {summary.last:.4g} | {row.protocol(metric)} | {evidence} |")
    return lines


def _decisions(experiments: list[str]) -> tuple[list[Any], list[str]]:
    from idmctl.track.compare import has_tracking_store  # start-up: the card's sections load the store/track modules only when drawn
    from idmctl.track.goal_decisions import build_decisions  # start-up: the card's sections load the store/track modules only when drawn

    reports: list[Any] = []
    notes: list[str] = []
    for experiment in experiments:
        if not has_tracking_store():
            notes.append(f"{experiment}: no tracked run evaluated yet")
            continue
        try:
            reports += build_decisions(experiment)
        except UserError as exc:
            notes.append(f"{experiment}: {exc.what}" + (f" ({exc.hint})" if exc.hint else ""))
    return reports, notes


# ------------------------------------------------------------------------------------------ the card

def build_card(experiments: list[str], with_figures: bool = False) -> Card:
    """The card for one or more experiments (a chain's experiment, or the several a card covers)."""
    if not experiments:
        raise UserError("no experiment given", field="EXP", hint="e.g. idmctl report latent_c_n4")
    from ground.spec.loader import resolve_spec_path  # start-up: the card's sections load the store/track modules only when drawn

    for experiment in experiments:
        if "#" in experiment:
            raise UserError(f"{experiment}: give the experiment, not the chain", field="EXP",
                            hint=f"idmctl report {experiment.split('#')[0]} (every chain and attempt of it is on the card)")
    jobs = _jobs(experiments)
    if not jobs:
        for experiment in experiments:
            resolve_spec_path(experiment)  # an unknown name: one line with a did-you-mean
    failures = _failure_rows(experiments)
    by_job = {row.job: row for row in failures}
    reports, decision_notes = _decisions(experiments)
    gpu_lines, total = _gpu_hours(experiments)
    card = Card(title=f"Where {', '.join(experiments)} stands", experiments=experiments, decisions=reports)

    # TL;DR
    tldr = []
    if jobs:
        newest = jobs[-1]
        tldr.append(f"- status: {len(jobs)} jobs; the newest, {newest.scheduler_id or newest.id} ({newest.experiment}), "
                    f"is {newest.state}")
    else:
        tldr.append(f"- status: nothing submitted yet for {', '.join(experiments)}")
    for report in reports:
        est = report.estimate
        if est is not None:
            u = f" {report.unit}" if report.unit else ""
            tldr.append(f"- decision: {report.subject}: {report.verdict} for {report.goal} — mean {est.mean:.4g}{u}, "
                        f"95 % interval [{est.low:.4g}, {est.high:.4g}]{u} ({est.method}), "
                        f"P(goal) {report.decision.p_goal:.2f}")
        else:
            tldr.append(f"- decision: {report.subject}: {report.verdict} for {report.goal} ({report.lines[-1] if report.lines else ''})")
    tldr += [f"- decision: {note}" for note in decision_notes]
    if total is not None:
        tldr.append(f"- GPU-hours: {total.charged_h:.2f} charged, {total.useful_h:.2f} useful, {total.lost_total_h:.2f} lost")
    card.sections.append(("TL;DR", tldr))
    card.sections.append(("The plan's arithmetic", _plan(experiments)))
    card.sections.append(("Parameters by part", _parameters(experiments)))
    card.sections.append(("Finish date (P10–P90)", _finish(experiments, jobs)))
    card.sections.append(("Every attempt", _attempts(jobs, by_job)))
    if failures:
        from idmctl.ops.failures.report import markdown  # start-up: the card's sections load the store/track modules only when drawn

        table = markdown(failures, title="Failed jobs: cause, fix, caught now by").splitlines()
        card.sections.append(("Failures and their fixes", table))
    card.sections.append(("GPU-hours", gpu_lines))
    card.sections.append(("Baselines under their protocols", _baselines()))
    decided = []
    for report in reports:
        decided += [f"### {report.subject}: goal {report.goal}", ""] + [f"- {line}" for line in report.warnings + report.lines] + [""]
    if decided:
        card.sections.append(("Decisions", decided))

    # What is still open
    open_items = [_open_job(j) for j in jobs if j.ended_at is None]
    open_items += [f"- failure {row.job} ({row.cause}) has no fix recorded (suggested: {row.suggested_fix})"
                   for row in failures if row.fix_id is None]
    for report in reports:
        if report.verdict == "UNDECIDED":
            open_items.append(f"- {report.subject}: goal {report.goal} UNDECIDED — {report.lines[-1] if report.lines else ''}")
    open_items += [f"- {note}" for note in decision_notes]
    card.open_items = open_items
    card.sections.append(("Still open", open_items or ["Nothing open."]))
    if with_figures:
        card.figures = _figures(card, jobs)
    return card


def _open_job(job: JobRecord) -> str:
    """A job not ended; a pending one with why it waits (Slurm's reason, read) and since when."""
    name = f"- job {job.scheduler_id or job.id} ({job.experiment})"
    if job.state is JobState.PENDING:
        from datetime import datetime, timezone

        from idmctl.plan.pending import why_pending  # start-up: only a card with a pending job reads it

        submitted = job.submitted_at
        if submitted is not None and submitted.tzinfo is None:
            submitted = submitted.replace(tzinfo=timezone.utc)
        waited = (datetime.now(timezone.utc) - submitted).total_seconds() if submitted else None
        return f"{name} is {why_pending(job.reason).line(waited)}"
    return f"{name} is {job.state_text}"


def _figures(card: Card, jobs: list[JobRecord]) -> list[tuple[str, bytes]]:
    """The per-episode results with their interval (decide's plot), and GPU-hours per attempt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[tuple[str, bytes]] = []
    drawn = [r for r in card.decisions if r.runs]
    if drawn:
        from idmctl.track.goal_decisions import decision_figure  # start-up: the card's sections load the store/track modules only when drawn

        figures.append(("per-episode results, the estimate and its 95 % interval, the goal", _png(decision_figure(drawn), plt)))
    ended = [j for j in jobs if j.started_at and j.ended_at]
    if ended:
        figure, axis = plt.subplots(figsize=(9, 3), dpi=100)
        hours = [(j.ended_at - j.started_at).total_seconds() / 3600 * (j.gpus or 0) for j in ended]
        axis.bar([str(j.scheduler_id or j.id) for j in ended], hours,
                 color=["tab:green" if j.state is JobState.COMPLETED else "tab:red" for j in ended])
        axis.set(ylabel="GPU-hours charged", xlabel="job (green: completed, red: ended otherwise)")
        figures.append(("GPU-hours charged per attempt", _png(figure, plt)))
    return figures


def _png(figure: Any, plt: Any) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def card_json(card: Card) -> dict[str, Any]:
    return {"title": card.title, "experiments": card.experiments,
            "sections": [{"heading": h, "lines": body} for h, body in card.sections],
            "decisions": [r.to_json() for r in card.decisions], "open": card.open_items,
            "figures": [caption for caption, _ in card.figures]}


__all__ = ["Card", "build_card", "card_json", "json"]
