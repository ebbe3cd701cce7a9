"""What every line of the probe shares: the run record (`ProbeRun`) and the rollout id of the unfixed code
(`BASE`). Below the runner, which fills a `ProbeRun`, and the verdicts and replay that judge one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from grader.hacks.common import HackFinding
from grader.probe.transform import Probe

BASE = "__unfixed__"  # the rollout id the unfixed code is evaluated under, beside the candidates


@dataclass
class ProbeRun:
    """What one group's probe run produced."""

    probed: bool
    why_not: str = ""
    probe: Probe | None = None
    records: dict[str, list[dict]] = field(default_factory=dict)  # rollout id (and BASE) -> records
    statuses: dict[str, str] = field(default_factory=dict)
    patches: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    findings: dict[str, list[HackFinding]] = field(default_factory=dict)

    def behaviour(self) -> dict[str, list[dict]]:
        """The findings as a group's `behaviour` field: rollout_id -> [finding dicts]."""
        return {rid: [asdict(f) for f in found] for rid, found in self.findings.items()}
