"""Issue 7, part 1: the adversarial corpus through `gagar eval` (real Docker, real git), with host-side checks
that nothing escaped. The corpus lives in `hardening/corpus.py`; the checks in `hardening/harness.py`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardening.corpus import Bait, Case, build_corpus  # noqa: E402
from hardening.harness import Listener, check_case, docker_reason, run_corpus  # noqa: E402
from sandbox.patchcheck import EmptyPatch, PatchRejected, validate_patch  # noqa: E402


def _bait(tmp_path: Path) -> Bait:
    return Bait(host_dir=str(tmp_path), mark="m0", secret="SECRET-xyz", port=1, host_ips=["10.0.0.1"])


def test_corpus_is_well_formed(tmp_path: Path) -> None:
    """Every case the sandbox must refuse is refused by the validator alone, every other one passes it, and
    the secret never appears in a patch (it may reach an output only by escaping)."""
    corpus = build_corpus(tmp_path, _bait(tmp_path))
    cases = corpus["cases"]
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) and len(cases) >= 40
    repo = corpus["fortress"].path
    for c in cases:
        assert "SECRET-xyz" not in c.patch
        if c.status == ("rejected",):
            with pytest.raises(PatchRejected):
                validate_patch(c.patch, repo, max_bytes=1 << 20)
        elif c.status == ("empty_patch",):
            with pytest.raises(EmptyPatch):
                validate_patch(c.patch, repo, max_bytes=1 << 20)
        elif "rejected" not in c.status:
            validate_patch(c.patch, repo, max_bytes=1 << 20)
    huge = next(c for c in cases if c.name == "huge_diff_50mb")
    assert len(huge.patch) >= 50 * 10**6
    non_utf8 = next(c for c in cases if c.name == "non_utf8")
    assert b"\xe9" in non_utf8.patch.encode("utf-8", "surrogateescape")
    assert (tmp_path / "bait" / "SECRET.txt").read_text().strip() == "SECRET-xyz"


@pytest.mark.docker
def test_adversarial_corpus_is_contained(tmp_path: Path) -> None:
    reason = docker_reason()
    if reason:
        pytest.skip(reason)
    report = run_corpus(tmp_path / "corpus", workers=2, timeout=20)
    s = report.summary()
    assert s["failed"] == [], "\n".join(s["failed"])
    assert s["lost_results"] == 0
    assert len(s["infra_retried"]) <= 2, s["infra_retried"]  # host faults are retried once, never many
    assert s["contained"] == s["cases_tried"] - len(s["known_limits"])
    # The documented gaps (docs/sandbox-patches.md, "Known limits") are tried and reported, not hidden.
    # go_hidden_pass_exit is caught: its syscall.Exit is the one way past -test.paniconexit0 (sandbox-patches.md).
    assert [k.split(":")[0] for k in s["known_limits"]] == ["forge_import_time", "game_always_equal"]
    forging = s["forging"]
    assert forging["tried"] >= 25 and forging["detected"] == forging["tried"] - 2
    assert forging["remaining"] == ["forge_import_time", "game_always_equal"]
    by = {o.name: o for o in report.outcomes}
    assert by["go_hidden_pass_exit"].suspicious and by["go_hidden_pass_exit"].status == "unresolved"
    assert by["gold"].status == "resolved" and by["wrong"].status == "unresolved"  # the harness sees both
    assert by["cpu_spin"].status == "timeout" and by["memory_hog"].status == "unresolved"


def test_escape_checks_can_fail(tmp_path: Path) -> None:
    """Negative control: the host-side checks do flag an escape when one happens (a connection, the secret in
    a log, a leftover process, a wrong status), so a green corpus run means something."""
    with Listener() as lis:
        socket.create_connection(("127.0.0.1", lis.port), timeout=5).close()
        for _ in range(50):
            if lis.peers:
                break
            time.sleep(0.1)
    assert len(lis.peers) == 1
    bait = _bait(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    (log / "test_output.txt").write_text("leaked: SECRET-xyz\n")
    case = Case("children", "processes", "", "", ("resolved",), False)
    sleeper = subprocess.Popen(["sleep", bait.sleep_arg("children")])
    try:
        out = check_case(case, {"status": "unresolved", "tampered_tests": False, "error": None, "duration_s": 1,
                                "log_path": str(log)}, bait, tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    text = " | ".join(out.problems)
    assert not out.contained
    assert "status 'unresolved'" in text and "secret" in text and "sleeping processes" in text
    assert check_case(case, None, bait, tmp_path).problems == ["no result line (lost)"]
