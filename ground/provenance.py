"""Where a planned figure comes from: measured (which run, which smoke, on which device kind) or estimated.

A plan derived on this CPU host for a GPU job has no GPU compute to go on: its step time is the data
read time alone, a lower bound. Every figure a preflight derives (io, the derived limits, the budget,
the build estimate, ``exp show`` and their ``--json``) carries one :class:`Provenance`, so no
figure reads as measured that was not.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Basis(str, Enum):
    MEASURED = "measured"
    """Timed by a smoke or a recorded run on the job's device kind."""
    ESTIMATED = "estimated"
    """Arithmetic on the spec and the cluster profile (bytes ÷ bandwidth), nothing timed."""
    LOWER_BOUND = "lower_bound"
    """Part of the figure was not measured and counts as 0: the real figure is at least this."""
    UNMEASURED = "unmeasured"
    """Timed, but on another device kind than the job's: the figure does not stand for the job."""


class DeviceKind(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def of(cls, device: str) -> "DeviceKind":
        """``cuda:0`` → CUDA, ``cpu`` → CPU: the kind a timing stands for."""
        return cls.CUDA if device.startswith("cuda") else cls.CPU

    @classmethod
    def of_job(cls, gpus: int) -> "DeviceKind":
        return cls.CUDA if gpus > 0 else cls.CPU

    @property
    def label(self) -> str:
        return "GPU" if self is DeviceKind.CUDA else "CPU"


@dataclass(frozen=True)
class Provenance:
    basis: Basis
    source: str
    """What the figure came from: ``smoke on cuda:0 (batch 2)``, ``run latent_c_n4/3``, ``no GPU smoke``."""
    device: DeviceKind | None = None
    """The device kind the measurement ran on (None for estimates)."""

    @property
    def label(self) -> str:
        """The words shown beside the figure."""
        if self.basis is Basis.LOWER_BOUND:
            return f"data-bound lower bound; compute unmeasured ({self.source})"
        if self.basis is Basis.MEASURED:
            return f"measured: {self.source}"
        if self.basis is Basis.UNMEASURED:
            return f"unmeasured on the job's device kind ({self.source})"
        return f"estimated: {self.source}"

    @property
    def measured(self) -> bool:
        return self.basis is Basis.MEASURED

    def as_dict(self) -> dict[str, Any]:
        return {"basis": self.basis.value, "source": self.source,
                "device": None if self.device is None else self.device.value, "label": self.label}


def compute_unmeasured(job: DeviceKind, why: str | None = None) -> Provenance:
    """A step time with no compute in it: ``no GPU smoke`` for a GPU job unless ``why`` says otherwise."""
    return Provenance(Basis.LOWER_BOUND, why or f"no {job.label} smoke")
