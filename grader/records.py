"""Typed records of `gagar grade` (the contracts are in docs/contracts.md).

A `Group` is one instance's passing candidates; a `Grading` is one output line. Both round-trip through
plain dicts so that JSONL files, the SFT data builder and the trainer share exactly one schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.jsonl import JsonlError, parse_lines, read_text, write_jsonl_atomic  # noqa: F401 (re-exported)
from sandbox.records import EvalResult, Instance

# Tier (1 = best) -> quality weight f in (0, 1]: part of the grading output contract; the advantage engine's
# default mapping is this one.
TIER_WEIGHTS: dict[int, float] = {1: 1.0, 2: 0.6, 3: 0.2}


def tier_weights(tiers: dict[str, int]) -> dict[str, float]:
    """{rollout_id: tier} -> {rollout_id: f}, the `weights` of a grading line."""
    return {k: TIER_WEIGHTS[t] for k, t in tiers.items()}


class InputError(ValueError):
    """Bad user input (the CLI turns it into exit code 2 with this message)."""


@dataclass
class Candidate:
    rollout_id: str
    patch: str
    test_output: str | None = None
    trajectory: Any = None

    @classmethod
    def from_dict(cls, d: Any, where: str = "candidate") -> Candidate:
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected an object with rollout_id and patch, got {type(d).__name__}")
        if d.get("rollout_id") is None or str(d.get("rollout_id")) == "":
            raise InputError(f"{where}: missing rollout_id")
        patch = d.get("patch")
        if not isinstance(patch, str):
            raise InputError(f"{where}: 'patch' must be a string (the unified diff)")
        test_output = d.get("test_output")
        return cls(
            rollout_id=str(d["rollout_id"]),
            patch=patch,
            test_output=test_output if isinstance(test_output, str) else None,
            trajectory=d.get("trajectory"),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rollout_id": self.rollout_id, "patch": self.patch}
        if self.test_output is not None:
            d["test_output"] = self.test_output
        if self.trajectory is not None:
            d["trajectory"] = self.trajectory
        return d


@dataclass
class Group:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    candidates: list[Candidate]
    # What the task's tests exercise, so the judge can tell special-casing of test inputs from a general fix.
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = field(default_factory=list)
    # Behavioural hack findings (`grader.probe.runner`): rollout_id -> [{kind, file, line, detail}]; they join the
    # static findings as verdicts and are shown to the judge.
    behaviour: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, where: str = "group") -> Group:
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(d).__name__}")
        missing = [k for k in ("instance_id", "repo", "base_commit") if not d.get(k)]
        if missing:
            raise InputError(f"{where}: missing {', '.join(missing)}")
        iid = str(d["instance_id"])
        if "/" not in str(d["repo"]):
            raise InputError(f"{where} ({iid}): repo must be 'owner/name', got {d['repo']!r}")
        cands = d.get("candidates")
        if not isinstance(cands, list):
            raise InputError(f"{where} ({iid}): 'candidates' must be a list of {{rollout_id, patch}}")
        candidates = [Candidate.from_dict(c, f"{where} ({iid}) candidate {i}") for i, c in enumerate(cands)]
        ids = [c.rollout_id for c in candidates]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise InputError(f"{where} ({iid}): duplicate rollout_id(s) {', '.join(dupes)}")
        f2p = d.get("FAIL_TO_PASS") or []
        if isinstance(f2p, str):
            try:
                f2p = json.loads(f2p)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where} ({iid}): FAIL_TO_PASS is a string but not a JSON list ({exc})") from exc
        if not isinstance(f2p, list):
            raise InputError(f"{where} ({iid}): FAIL_TO_PASS must be a list of test ids")
        return cls(
            instance_id=iid,
            repo=str(d["repo"]),
            base_commit=str(d["base_commit"]),
            problem_statement=str(d.get("problem_statement") or ""),
            candidates=candidates,
            test_patch=str(d.get("test_patch") or ""),
            FAIL_TO_PASS=[str(t) for t in f2p],
            behaviour=_behaviour(d.get("behaviour"), f"{where} ({iid})"),
        )

    @classmethod
    def from_results(
        cls,
        instance: Instance,
        results: Iterable[EvalResult],
        patches: Mapping[str, str],
        *,
        trajectories: Mapping[str, Any] | None = None,
        grading: Grading | None = None,
    ) -> Group:
        """THE sandbox -> grader conversion (trainer, verl reward, SFT data): the passing rollouts of one
        instance (`EvalResult.passed`: hacks and forged reports never reach the judge), in the results' order,
        with the task's test patch and FAIL_TO_PASS so that special-casing of test inputs can be recognised.
        `patches` and `trajectories` are keyed by rollout id; a rollout without a patch is not a candidate.
        With `grading`, the hacks it found are left out too (see `passes`)."""
        cands = [Candidate(r.rollout_id, patches[r.rollout_id],
                           trajectory=(trajectories or {}).get(r.rollout_id) or None)
                 for r in results if r.instance_id == instance.instance_id and passes(r, grading) and r.rollout_id in patches]
        return cls.of_instance(instance, cands)

    @classmethod
    def of_instance(cls, instance: Instance, candidates: list[Candidate]) -> Group:
        """A group of `candidates` already known to pass (verl's batch says which): every task field comes
        from `instance`, here only, so no caller can forget the test patch the hack detector needs."""
        return cls(instance_id=instance.instance_id, repo=instance.repo, base_commit=instance.base_commit,
                   problem_statement=instance.problem_statement, candidates=list(candidates),
                   test_patch=instance.test_patch, FAIL_TO_PASS=list(instance.FAIL_TO_PASS))

    @property
    def repo_dirname(self) -> str:
        return self.repo.replace("/", "__")

    def candidate(self, rollout_id: str) -> Candidate:
        for c in self.candidates:
            if c.rollout_id == rollout_id:
                return c
        raise KeyError(rollout_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "problem_statement": self.problem_statement,
            "candidates": [c.to_dict() for c in self.candidates],
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": list(self.FAIL_TO_PASS),
            **({"behaviour": {k: [dict(f) for f in v] for k, v in self.behaviour.items()}} if self.behaviour else {}),
        }


def _behaviour(raw: Any, where: str) -> dict[str, list[dict[str, Any]]]:
    """Validated `behaviour` findings of a group line (see Group.behaviour)."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise InputError(f"{where}: 'behaviour' must map rollout ids to lists of findings")
    out: dict[str, list[dict[str, Any]]] = {}
    for rid, items in raw.items():
        if not isinstance(items, list) or not all(
                isinstance(f, dict) and f.get("kind") in ("special_casing", "silencing", "weakening") for f in items):
            raise InputError(f"{where}: behaviour[{rid!r}] must be a list of {{kind, file, line, detail}} with kind "
                             "special_casing, silencing or weakening")
        out[str(rid)] = [{"kind": f["kind"], "file": str(f.get("file") or ""), "line": int(f.get("line") or 1),
                          "detail": str(f.get("detail") or "")} for f in items]
    return out


@dataclass
class Grading:
    """One output line of `gagar grade`; `agreement` is only set when several permutations ran."""

    instance_id: str
    ranking: list[str]
    tiers: dict[str, int]
    weights: dict[str, float]
    evidence: dict[str, list[str]]
    judge: str
    fallback: bool = False
    agreement: float | None = None
    notes: list[str] = field(default_factory=list)
    # Candidates judged to pass by gaming the tests: rollout_id -> kind (special_casing | silencing | weakening).
    # Ranked last at tier 3; the trainer resets their reward to failure.
    hacks: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "instance_id": self.instance_id,
            "ranking": list(self.ranking),
            "tiers": dict(self.tiers),
            "weights": dict(self.weights),
            "evidence": {k: list(v) for k, v in self.evidence.items()},
            "judge": self.judge,
            "fallback": self.fallback,
            "hacks": dict(self.hacks),
        }
        if self.agreement is not None:
            d["agreement"] = self.agreement
        if self.notes:
            d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grading:
        return cls(
            instance_id=str(d["instance_id"]),
            ranking=[str(r) for r in d["ranking"]],
            tiers={str(k): int(v) for k, v in d.get("tiers", {}).items()},
            weights={str(k): float(v) for k, v in d.get("weights", {}).items()},
            evidence={str(k): [str(s) for s in v] for k, v in d.get("evidence", {}).items()},
            judge=str(d.get("judge", "")),
            fallback=bool(d.get("fallback", False)),
            agreement=d.get("agreement"),
            notes=list(d.get("notes") or []),
            hacks={str(k): str(v) for k, v in (d.get("hacks") or {}).items()},
        )


def passes(result: EvalResult, grading: Grading | None = None) -> bool:
    """A rollout passes when the sandbox says so (`EvalResult.passed`: resolved, not tampered, no forged
    report) and the grader found no hack in it (`Grading.hacks`). Every stage that rewards uses this."""
    return result.passed and not (grading is not None and result.rollout_id in grading.hacks)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file (a JSON list is accepted too); errors name the file and line."""
    p = Path(path)
    try:
        text, bad_utf8 = read_text(p)
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                data = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise InputError(f"{p}: not valid JSON ({exc})") from exc
            if not all(isinstance(x, dict) for x in data):
                raise InputError(f"{p}: a JSON list must hold objects")
            return data
        return [row for _, row in parse_lines(text, str(p), bad_utf8=bad_utf8)]  # strict: errors name the line
    except JsonlError as exc:
        raise InputError(str(exc)) from exc


def load_results(path: str | Path) -> list[EvalResult]:
    """A `gagar eval` results.jsonl (the sandbox's `EvalResult` lines), strictly: a line that is not a result
    record is an InputError naming it."""
    out = []
    for i, r in enumerate(read_jsonl(path), 1):
        if not r.get("instance_id") or r.get("rollout_id") is None:
            raise InputError(f"{path}: line {i} lacks instance_id or rollout_id (is it a results.jsonl?)")
        try:
            out.append(EvalResult.from_dict({"model_name_or_path": "unknown", **r}))
        except (TypeError, ValueError) as exc:
            raise InputError(f"{path}: line {i} is not a result record ({exc})") from exc
    return out


def groups_from_run(instances: Mapping[str, Instance], results: list[EvalResult],
                    patches: Mapping[tuple[str, str], str], *, image: str | None = None,
                    source: str = "the results") -> tuple[list[Group], list[str]]:
    """One group per instance of `results` (in their order) with its passing rollouts, and notes on what was left
    out. `patches`: (instance_id, rollout_id) -> the evaluated patch; `image`: the `--image` the run used.
    Raises InputError when a result's patch or instance is not the one the sandbox evaluated: each result's
    `verdict_key` (the sha256 the sandbox recorded of the patch and the instance fields that decide its verdict)
    must still match, or a prediction edited since the run would be graded with a verdict about another one."""
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


def load_groups(path: str | Path) -> list[Group]:
    rows = read_jsonl(path)
    groups = [Group.from_dict(r, f"{path}: group {i + 1}") for i, r in enumerate(rows)]
    ids = [g.instance_id for g in groups]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise InputError(f"{path}: duplicate instance_id(s) {', '.join(dupes[:5])}")
    return groups
