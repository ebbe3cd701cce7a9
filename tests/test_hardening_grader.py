"""Issue 7, part 2 (grader): garbage, truncated and hostile judge-model replies never crash or hang a step and
never show a host file; hostile candidate patches never crash the heuristic ranker; a prompt injection inside a
candidate diff gains nothing with the heuristic ranker. `ScriptedBackend` stands in for a broken model."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening.grader_cases import run_hostile_judge, run_hostile_patches, run_injection  # noqa: E402


def test_hostile_judge_replies_never_crash_hang_or_leak(tmp_path: Path) -> None:
    out = run_hostile_judge(tmp_path)
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["scripts"] >= 15


def test_hostile_candidate_patches_never_crash_the_ranker(tmp_path: Path) -> None:
    out = run_hostile_patches(tmp_path)
    assert out["problems"] == [], "\n".join(out["problems"])


def test_prompt_injection_gains_nothing_with_the_heuristic(tmp_path: Path) -> None:
    out = run_injection(tmp_path)
    assert out["problems"] == [], "\n".join(out["problems"])
    assert out["injected"][0] == "minimal"
    assert out["weights"]["injected"] <= out["weights"]["neutral"]
