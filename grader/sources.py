"""Where `gagar grade`'s groups come from besides a groups file: a `gagar eval` run, and the behavioural probe's
findings on them.

`groups_from_run` is the data path's sandbox → grader step as a command: a run's results (which hold no
patches), the predictions it evaluated (the patches) and the instances give one `Group` per instance with its
passing rollouts (`Group.from_results`: the one conversion the trainer and the SFT data builder use too). Each
result's `verdict_key` (the sha256 the sandbox recorded of the patch and the instance fields that decide its
verdict) must still match: a prediction or instance edited since the run would be graded with a verdict that
was about something else.

`probe_groups` runs the behavioural probe (`grader.probe.runner.probe_group`) on groups before they are graded:
each group's passing candidates and the unfixed code re-run the task's instrumented failing tests in the sandbox;
what it finds becomes `Group.behaviour`, which every judge turns into hack verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from grader.records import Group, InputError
from sandbox.config import SandboxConfig
from sandbox.records import EvalResult, Instance


def groups_from_run(instances: Mapping[str, Instance], results: list[EvalResult],
                    patches: Mapping[tuple[str, str], str], *, image: str | None = None,
                    source: str = "the results") -> tuple[list[Group], list[str]]:
    """One group per instance of `results` (in their order) with its passing rollouts, and notes on what was left
    out. `patches`: (instance_id, rollout_id) -> the evaluated patch; `image`: the `--image` the run used.
    Raises InputError when a result's patch or instance is not the one the sandbox evaluated."""
    from sandbox.report import verdict_key

    notes: list[str] = []
    by_inst: dict[str, list[EvalResult]] = {}
    for r in results:
        by_inst.setdefault(r.instance_id, []).append(r)
    unknown = [iid for iid in by_inst if iid not in instances]
    if unknown:
        notes.append(f"{len(unknown)} instance(s) of {source} not in the instances file, left out: "
                     + ", ".join(unknown[:5]) + (" …" if len(unknown) > 5 else ""))
    changed, no_patch = [], []
    for iid, rows in by_inst.items():
        for r in rows:
            if iid not in instances or not r.passed:
                continue
            patch = patches.get(r.key)
            if patch is None:
                no_patch.append(f"{iid}::{r.rollout_id}")
            elif r.verdict_key and verdict_key(instances[iid], patch, image) != r.verdict_key:
                changed.append(f"{iid}::{r.rollout_id}")
    if changed:
        raise InputError(
            f"{len(changed)} passing result(s) of {source} were evaluated with another patch or instance than the "
            f"ones given ({', '.join(changed[:5])}{' …' if len(changed) > 5 else ''}): run `gagar eval` again on "
            "these predictions and instances (or give the --image that run used)")
    if no_patch:
        notes.append(f"{len(no_patch)} passing result(s) have no prediction with a patch, left out: "
                     + ", ".join(no_patch[:5]) + (" …" if len(no_patch) > 5 else ""))
    groups, empty = [], 0
    for iid, rows in by_inst.items():
        if iid not in instances:
            continue
        group = Group.from_results(instances[iid], rows, {r.rollout_id: patches[r.key] for r in rows
                                                          if r.key in patches})
        if group.candidates:
            groups.append(group)
        else:
            empty += 1
    if empty:
        notes.append(f"{empty} instance(s) with no passing rollout: nothing to grade")
    return groups, notes


@dataclass
class ProbeStats:
    """What `probe_groups` did: seconds per probed group, why the others were not probed, findings per kind."""

    seconds: list[float] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # instance_id -> why not probed
    findings: dict[str, int] = field(default_factory=dict)  # kind -> candidates flagged

    def line(self) -> str:
        n = len(self.seconds)
        per = f", {sum(self.seconds) / n:.1f} s per group ({sum(self.seconds):.0f} s)" if n else ""
        found = ", ".join(f"{k} {v}" for k, v in sorted(self.findings.items())) or "none"
        out = f"probe: {n} group(s) probed{per}; candidates flagged: {found}"
        if self.skipped:
            out += f"; {len(self.skipped)} not probed (" + "; ".join(
                f"{i}: {why}" for i, why in list(self.skipped.items())[:3]) + (" …" if len(self.skipped) > 3 else "") + ")"
        return out


def probe_groups(groups: list[Group], instances: Mapping[str, Instance], config: SandboxConfig, *,
                 on_group: Callable[[Group, float], None] | None = None) -> ProbeStats:
    """Probe each group's passing candidates (budget per candidate run: `config.timeout`) and set its
    `behaviour` to the findings; a group whose instance cannot be probed keeps what it had."""
    from grader.probe.runner import probe_group

    stats = ProbeStats()
    for g in groups:
        inst = instances.get(g.instance_id)
        if inst is None:
            stats.skipped[g.instance_id] = "not in the instances file"
            continue
        t0 = time.monotonic()
        run = probe_group(inst, {c.rollout_id: c.patch for c in g.candidates}, config, budget_s=config.timeout)
        if not run.probed or run.why_not:
            stats.skipped[g.instance_id] = run.why_not or "not probed"
        if run.probed:
            stats.seconds.append(round(time.monotonic() - t0, 2))
            g.behaviour = {rid: [asdict(f) for f in found] for rid, found in run.findings.items() if found}
            for found in g.behaviour.values():
                for kind in {f["kind"] for f in found}:
                    stats.findings[kind] = stats.findings.get(kind, 0) + 1
        if on_group:
            on_group(g, time.monotonic() - t0)
    return stats
