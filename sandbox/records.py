"""Typed records that cross the sandbox boundary (the contracts are in docs/contracts.md).

`Instance` and `Prediction` are what users hand to `gagar eval`; `EvalResult` is one line of
`results.jsonl` and what the trainer and grader read back. Field names follow SWE-bench.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("resolved", "unresolved", "empty_patch", "patch_failed", "rejected", "timeout", "infra_error")


def _as_list(value: Any, name: str, instance_id: str) -> list[str]:
    """SWE-bench ships FAIL_TO_PASS / PASS_TO_PASS as JSON strings of lists; accept both forms."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"instance {instance_id}: {name} is a string but not a JSON list ({exc})") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"instance {instance_id}: {name} must be a list of test ids")
    return list(value)


def _env(value: Any, instance_id: str) -> dict[str, Any] | None:
    """Validated env spec (a SpecError — bad input that stops the run — on unknown keys or wrong types)."""
    if value in (None, {}):
        return None
    from sandbox.env.spec import EnvSpec

    return EnvSpec.from_dict(value, f"instance {instance_id}: env").to_dict()


@dataclass
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    problem_statement: str = ""
    test_cmd: str = ""
    test_framework: str = "pytest"
    image: str | None = None
    language: str | None = None
    # Environments (docs/environments.md): SWE-bench's version and
    # environment_setup_commit, and an `env` spec (dict with sandbox.env.spec.KEYS, validated on load).
    version: str | None = None
    environment_setup_commit: str | None = None
    env: dict[str, Any] | None = None
    # SWE-bench rows as shipped (sandbox/env/swebench.py): the parser whose test-id spelling grades the row, and
    # a 5.x row's own eval script and eval type (`pass_and_fail` | `fail_only`).
    log_parser: str | None = None
    eval_script: str | None = None
    eval_type: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Instance:
        missing = [k for k in ("instance_id", "repo", "base_commit") if not d.get(k)]
        if missing:
            raise ValueError(f"instance record is missing {', '.join(missing)}")
        iid = str(d["instance_id"])
        if "/" not in d["repo"]:
            raise ValueError(f"instance {iid}: repo must be 'owner/name', got {d['repo']!r}")
        return cls(
            instance_id=iid,
            repo=d["repo"],
            base_commit=d["base_commit"],
            patch=d.get("patch") or "",
            test_patch=d.get("test_patch") or "",
            FAIL_TO_PASS=_as_list(d.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid),
            PASS_TO_PASS=_as_list(d.get("PASS_TO_PASS"), "PASS_TO_PASS", iid),
            problem_statement=d.get("problem_statement") or "",
            test_cmd=d.get("test_cmd") or "",
            test_framework=d.get("test_framework") or "pytest",
            image=d.get("image") or None,
            language=d.get("language") or None,
            version=None if d.get("version") in (None, "") else str(d["version"]),
            environment_setup_commit=d.get("environment_setup_commit") or None,
            env=_env(d.get("env"), iid),
            log_parser=d.get("log_parser") or None,
            eval_script=d.get("eval_script") or None,
            eval_type=d.get("eval_type") or None,
        )

    @property
    def repo_dirname(self) -> str:
        """Local clone name under --repos-dir: `owner__name`."""
        return self.repo.replace("/", "__")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Prediction:
    instance_id: str
    model_patch: str
    model_name_or_path: str = "unknown"
    rollout_id: str = "0"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TestsStatus:
    FAIL_TO_PASS: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    PASS_TO_PASS: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})


@dataclass
class EvalResult:
    instance_id: str
    model_name_or_path: str
    rollout_id: str
    status: str
    resolved: bool = False
    patch_successfully_applied: bool = False
    tampered_tests: bool = False
    # The structured report disagreed with another channel (exit code, test files, nonce): treated as a hack.
    suspicious_report: bool = False
    tests_status: TestsStatus = field(default_factory=TestsStatus)
    exit_code: int | None = None
    duration_s: float = 0.0
    error: str | None = None
    apply_method: str | None = None
    log_path: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.instance_id, self.rollout_id)

    @property
    def hacked(self) -> bool:
        """The sandbox caught the patch gaming the tests (tampering or a forged report)."""
        return self.tampered_tests or self.suspicious_report

    @property
    def passed(self) -> bool:
        """The one definition of a passing rollout for every stage: resolved, and not by gaming the tests.

        A grader's hack verdict (`grader.records.Grading.hacks`) is applied on top of this by the trainer.
        """
        return self.resolved and not self.hacked

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        d = dict(d)
        ts = d.get("tests_status") or {}
        d["tests_status"] = TestsStatus(
            FAIL_TO_PASS=ts.get("FAIL_TO_PASS") or {"success": [], "failure": []},
            PASS_TO_PASS=ts.get("PASS_TO_PASS") or {"success": [], "failure": []},
        )
        d["rollout_id"] = str(d.get("rollout_id"))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
