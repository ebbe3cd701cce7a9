"""Issue 36, reward forging round 4: each class of patch shapes that resolved a task without fixing it, run
through the real `gagar eval` CLI (real Docker, real git) under both test commands (`python -m pytest -rA tests`
and `pytest -rA tests`). Every attack must come out unresolved or rejected, and the gold resolved.

Before issue 36 every class had shapes that came out `resolved` (27 of the 36 attack rollouts; the bomb made
the gagar process peak at 440 MiB) — see the report of the issue's branch and docs/reliability.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening import forging4  # noqa: E402
from hardening.harness import docker_reason  # noqa: E402
from sandbox.patchcheck import PatchRejected, validate_patch  # noqa: E402


def test_corpus_is_well_formed(tmp_path: Path) -> None:
    corpus = forging4.build(tmp_path)
    cases = corpus["cases"]
    assert {c.cls for c in cases} == set(forging4.CLASSES)
    assert all(sum(c.cls == k for c in cases) >= 1 for k in forging4.CLASSES)
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 2 * (len(cases) + 1)  # every case and the gold, on both commands
    repo = corpus["repos_dir"] / "acme__bastion"
    for c in cases:
        if c.cls in ("applier", "bomb"):  # refused before anything is written
            with pytest.raises(PatchRejected):
                validate_patch(c.patch, repo, max_bytes=1 << 20)
        else:
            validate_patch(c.patch, repo, max_bytes=1 << 20)
    bomb = next(c for c in cases if c.cls == "bomb")
    assert len(bomb.patch) < (1 << 20) < forging4.BOMB_BYTES // 100  # under the patch cap, expands 800-fold


@pytest.mark.docker
@pytest.mark.parametrize("cls", forging4.CLASSES)
def test_round4_class_does_not_resolve(cls: str, tmp_path: Path) -> None:
    reason = docker_reason()
    if reason:
        pytest.skip(reason)
    r = forging4.run(tmp_path, (cls,), workers=2, timeout=90, run_id=f"forging4-{cls}")
    assert r["problems"] == [], "\n".join(r["problems"])
    assert r["forged"] == 0 and r["gold_resolved"] == 2
    outcomes = r["outcomes"]
    if cls == "applier":
        assert all(o["status"] == "rejected" and "context-diff" in o["error"] for o in outcomes)
    elif cls == "bomb":
        assert all(o["status"] == "rejected" and "cap" in o["error"] for o in outcomes)
        assert r["peak_rss_mb"] < 150  # the host never reads (or writes) the 200 MiB
    elif cls == "config":
        assert all(o["tampered"] for o in outcomes)  # reverted before the run, and flagged
    elif cls in ("xfail", "hooks"):
        assert all(o["suspicious"] for o in outcomes)
    else:  # shadow: the copy is flagged, or the configuration that reached it was reverted
        assert all(o["suspicious"] or o["tampered"] for o in outcomes)
