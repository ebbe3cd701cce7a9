"""Issue 11, part A, end to end: git attacks planted through the agent's `run` tool in real containers, then every
host path (the episode's answer, `gagar eval` of it, the grader's workspace); marker files on the host prove
nothing ran, and a control proves each plant fires under plain host git. Also "no future": a repo with later
commits, tags, branches and dangling, packed objects, probed from an agent's tree and from an evaluation's.
The cases live in `hardening/agent_git.py` (the scripted policy there is a test stand-in for the model)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening.agent_git import attacks  # noqa: E402
from hardening.harness import docker_reason  # noqa: E402


def test_every_attack_the_issue_names_is_planted(tmp_path: Path) -> None:
    plants = " ".join(cmd for c in attacks(tmp_path, tmp_path / "s") for cmd in c.plant)
    for needle in ("filter.evil.clean", "filter.evil.smudge", ".gitattributes", "core.fsmonitor", ".git/hooks/",
                   "core.hooksPath", "core.pager", "diff.external", "textconv", "include.path", "core.sshCommand",
                   "core.editor", "gitdir:", "git init", "ln -s", "mkfifo"):
        assert needle in plants, needle


@pytest.mark.docker
def test_git_attacks_through_the_agent_are_contained(tmp_path: Path) -> None:
    reason = docker_reason()
    if reason:
        pytest.skip(reason)
    from hardening.agent_git import run_agent_git

    res = run_agent_git(tmp_path / "agent-git")
    assert res["problems"] == [], "\n".join(res["problems"])
    cases = {c["name"]: c for c in res["cases"]}
    assert res["contained"] == res["tried"] == len(cases) >= 16
    assert list((tmp_path / "agent-git" / "markers").iterdir()) == []
    for c in res["cases"]:
        if c["path"] == "agent" and not c["name"].startswith("future"):
            assert c["planted"] and c["finish"] == "submitted", c
    # Each plant with a control fires under plain host git: the attacks are real, the paths contain them.
    armed = [c for c in res["cases"] if "armed" in c]
    assert len(armed) >= 12 and all(c["armed"] for c in armed)
    # The answers went through the other host paths too: evaluated, and staged by the grader.
    assert cases["filter_clean_smudge"]["eval_status"] in ("unresolved", "resolved")
    assert cases["filter_clean_smudge"]["graded"]
    assert cases["symlink_host_secret"]["eval_status"] == "rejected"  # an absolute symlink, refused
    assert cases["future_agent"]["probe_ran"] and cases["future_eval"]["probe_ran"]
