"""Evaluation protocols: what a metric measured, so numbers of different protocols are never ranked together.

A protocol names what was evaluated (offline on a split, or which simulator and task), the episodes,
the seeds and the evaluator's code version. Its ``name`` is what tables show and goals match on:
``sim:Lift/valid:4ep`` is the quickstart's robosuite replay of its 4 held-out demos,
``offline:Lift/valid:4ep`` its offline roll-forward on the same demos, and card A's recorded numbers
carry the protocols written beside them in ``experiments/baselines.yaml``. Two numbers are
comparable only under the same name; the full record travels with every per-episode artifact.

No I/O here: evaluators fill it in, the trainer logs it, compare and decide read it back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OWN = "own"
"""The protocol of a goal that names none: whatever the spec's own evaluator measures for that metric."""
UNRECORDED = "unrecorded"
"""The protocol of a run metric logged before protocols were recorded (no ``idmctl.protocol.<metric>`` tag)."""


def protocol_name(kind: str, task: str, split: str, episodes: int) -> str:
    """``offline:Lift/valid:4ep``, ``sim:Lift/valid:4ep``."""
    prefix = "sim" if kind == "simulator" else kind
    return f"{prefix}:{task}/{split}:{episodes}ep"


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol, as recorded with the results it produced."""

    name: str
    kind: str
    """``offline`` (roll-forward against the recorded track) or ``simulator`` (replayed in robosuite)."""
    task: str
    """The environment the episodes come from (``Lift``), or the card's benchmark (``RoboCasa MG-30``)."""
    split: str
    episodes: list[str] = field(default_factory=list)
    """The episode names, in evaluation order; empty when the source did not record them (card A)."""
    seeds: list[int] = field(default_factory=list)
    evaluator: str = ""
    """``module:Class@<source digest>``; empty when not recorded."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Protocol":
        return cls(name=str(data["name"]), kind=str(data.get("kind", "")), task=str(data.get("task", "")),
                   split=str(data.get("split", "")), episodes=[str(e) for e in data.get("episodes") or []],
                   seeds=[int(s) for s in data.get("seeds") or []], evaluator=str(data.get("evaluator") or ""))

    def describe(self) -> str:
        """One line: ``sim:Lift/valid:4ep (robosuite replay of demo_8..demo_11, seed 0, trainers.sim.evaluate:…@ab12)``."""
        parts = [f"{len(self.episodes)} episodes {_span(self.episodes)}" if self.episodes else "episodes not recorded",
                 f"seed {', '.join(map(str, self.seeds))}" if self.seeds else "seeds not recorded",
                 self.evaluator or "evaluator version not recorded"]
        return f"{self.name} ({'; '.join(parts)})"


def _span(episodes: list[str]) -> str:
    return episodes[0] if len(episodes) == 1 else f"{episodes[0]}..{episodes[-1]}"
