"""Card A's failure table, written from the records: grouped rows, a markdown page, a rich table."""

from __future__ import annotations

from dataclasses import dataclass

from idmctl.ops.failures.rows import PostmortemRow

CARD_COLUMNS = ("job", "experiment", "setting", "cause", "evidence", "fix", "caught now by")


@dataclass
class CardRow:
    """Jobs that failed the same way and share a fix (or a chain) collapse into one line, as on the card."""

    jobs: list[str]
    experiment: str
    setting: str
    cause: str
    evidence: str
    fix: str
    caught_by: str

    @property
    def cause_label(self) -> str:
        return self.cause if len(self.jobs) == 1 else f"{self.cause} ×{len(self.jobs)}"

    def cells(self) -> list[str]:
        return [", ".join(self.jobs), self.experiment, self.setting, self.cause_label, self.evidence,
                self.fix, self.caught_by]


def fix_text(row: PostmortemRow) -> str:
    if row.fix:
        return f"{row.fix} ({row.commit[:12]})" if row.commit else row.fix
    return f"open — suggested: {row.suggested_fix}"


def card_rows(rows: list[PostmortemRow]) -> list[CardRow]:
    groups: dict[tuple[object, ...], CardRow] = {}
    for row in rows:
        if row.fix_id is not None:
            together: object = ("fix", row.fix_id)
        elif row.chain_id is not None:
            together = ("chain", row.chain_id)
        else:
            together = ("job", row.job_pk)
        key = (row.experiment, row.setting, row.cause, together)
        if key in groups:
            groups[key].jobs.append(row.job)
            continue
        groups[key] = CardRow(jobs=[row.job], experiment=row.experiment, setting=row.setting, cause=row.cause,
                              evidence=row.evidence, fix=fix_text(row), caught_by=row.caught_by)
    return list(groups.values())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[PostmortemRow], title: str = "Failed jobs") -> str:
    """A progress-card section: the table, then each recorded fix with the jobs it covers."""
    lines = [f"### {title}", "", "| " + " | ".join(CARD_COLUMNS) + " |", "|" + "---|" * len(CARD_COLUMNS)]
    for card_row in card_rows(rows):
        lines.append("| " + " | ".join(_cell(cell) for cell in card_row.cells()) + " |")
    fixes: dict[int, list[PostmortemRow]] = {}
    for row in rows:
        if row.fix_id is not None:
            fixes.setdefault(row.fix_id, []).append(row)
    if fixes:
        lines += ["", "Fixes recorded:", ""]
        for fix_id, covered in fixes.items():
            first = covered[0]
            commit = f" (commit {first.commit})" if first.commit else ""
            jobs = ", ".join(row.job for row in covered)
            lines.append(f"- fix {fix_id}: {first.fix}{commit} — covers {jobs}")
    open_count = sum(1 for row in rows if row.fix_id is None)
    lines += ["", f"{len(rows)} failed jobs, {len(rows) - open_count} with a recorded fix, {open_count} open."]
    return "\n".join(lines) + "\n"
