"""The fault scenarios, each returning {"problems": [...], ...figures}: an empty problem list means it held.

- `engine_crash`: the (private) Docker engine is killed mid-run; the run must end cleanly with `infra_error`
  lines that say why, and a re-run with the same run id must finish them — nothing lost, nothing duplicated.
- `interrupt`: SIGINT / SIGTERM mid-run; no container, no temp dir, no half-written line; resume completes.
- `report_dir_errors`: a report dir that is a file, read-only, or full gives a clear error (no traceback).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from hardening.faults import PrivateDockerd, result_lines, slow_predictions, wait_for_lines
from hardening.harness import ROOT, containers_of, eval_command, eval_env, gagar_eval
from hardening.repo import Fortress
from sandbox.workspace import OWNER_FILE


def _inputs(work: Path, n: int, sleep_s: float) -> tuple[Fortress, Path, Path, list[str]]:
    fortress = Fortress(work / "repos")
    inst = work / "instances.jsonl"
    inst.write_text(json.dumps(fortress.instance()) + "\n")
    preds = work / "predictions.jsonl"
    ids = slow_predictions(preds, fortress, n, sleep_s)
    return fortress, inst, preds, ids


def _check_lines(path: Path, ids: list[str], problems: list[str], what: str) -> list[dict]:
    good, bad = result_lines(path)
    if bad:
        problems.append(f"{what}: half-written result lines: {bad}")
    keys = [str(r["rollout_id"]) for r in good]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        problems.append(f"{what}: duplicated result lines for {dupes}")
    extra = sorted(set(keys) - set(ids))
    if extra:
        problems.append(f"{what}: results for unknown predictions {extra}")
    return good


def _owners(tmp: Path, names: list[str], *, first_pid: int) -> str:
    """Which run left each temp dir, and what is in it: enough to find the race from one failed run."""
    out = []
    for name in names:
        d = tmp / name
        try:
            owner = (d / OWNER_FILE).read_text().strip()
            inside = sorted(p.name for p in d.iterdir())[:8]
        except OSError as exc:
            owner, inside = f"unreadable ({exc.strerror})", []
        run = "first run" if owner == str(first_pid) else "re-run" if owner.isdigit() else "?"
        out.append(f"{name}: owner {owner} ({run}), holds {inside}")
    return "; ".join(out)


def engine_crash(work: Path, *, n: int = 6, sleep_s: float = 3.0) -> dict:
    """Kill a private dockerd after the first results; resume against the restarted engine."""
    work = Path(work)
    problems: list[str] = []
    _, inst, preds, ids = _inputs(work, n, sleep_s)
    run_id, out, tmp = "crash", work / "out", work / "tmp"
    res_path = out / run_id / "results.jsonl"
    with PrivateDockerd() as engine:
        env = eval_env({"DOCKER_HOST": engine.host}, tmp)
        out.mkdir(parents=True, exist_ok=True)
        with open(work / "first.log", "w+") as log:
            proc = subprocess.Popen(eval_command(inst, preds, work / "repos", run_id, out, workers=2, timeout=60),
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            before = wait_for_lines(res_path, 1, 180, proc)
            engine.kill()
            t_kill = time.monotonic()
            try:
                rc = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
            log.seek(0)
            first_out = log.read()
        ended_s = time.monotonic() - t_kill
        if rc != 0:
            problems.append(f"first run: exit {rc} after the engine died (expected 0, a completed run): "
                            f"{first_out[-1500:]}")
        first = _check_lines(res_path, ids, problems, "first run")
        infra = [r for r in first if r["status"] == "infra_error"]
        if not infra:
            problems.append(f"first run: no infra_error although the engine died after {before} result(s)")
        vague = [r["error"] for r in infra if "docker" not in (r.get("error") or "").lower()]
        if vague:
            problems.append(f"first run: infra_error without the reason (Docker engine) in words: {vague[:2]}")
        if len(first) != n:
            problems.append(f"first run: {len(first)} result lines for {n} predictions (lost)")
        if not (out / run_id / "report.json").exists():
            problems.append("first run: no report.json")
        engine.start()
        second = gagar_eval(inst, preds, work / "repos", run_id, out, workers=2, timeout=60,
                            env={"DOCKER_HOST": engine.host}, tmpdir=tmp)
        if second.rc != 0:
            problems.append(f"re-run: exit {second.rc}: {second.stderr[-1500:]}")
        final = _check_lines(res_path, ids, problems, "re-run")
        statuses = {str(r["rollout_id"]): r["status"] for r in final}
        if statuses != {i: "resolved" for i in ids}:
            problems.append(f"re-run: not every prediction finished: {statuses}")
        report = json.loads((out / run_id / "report.json").read_text())
        if report.get("resolved_instances") != n or report.get("error_instances"):
            problems.append(f"re-run: report.json counts {report.get('resolved_instances')} resolved, "
                            f"{report.get('error_instances')} errors")
        left = engine.containers(run_id)
        if left:
            problems.append(f"containers of the run left on the engine after the re-run: {left}")
    leftovers = sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []
    if leftovers:
        problems.append(f"temp dirs left behind: {leftovers} ({_owners(tmp, leftovers, first_pid=proc.pid)})")
    return {"problems": problems, "results_before_kill": before, "infra_errors": len(infra),
            "first_run_end_s": round(ended_s, 1), "lost": n - len(final), "predictions": n}


def interrupt(work: Path, sig: int, *, n: int = 6, sleep_s: float = 4.0) -> dict:
    """Send `sig` to `gagar eval` while containers run; then resume."""
    work = Path(work)
    name = signal.Signals(sig).name
    problems: list[str] = []
    _, inst, preds, ids = _inputs(work, n, sleep_s)
    run_id, out, tmp = f"sig-{name.lower()}-{os.getpid()}", work / "out", work / "tmp"
    res_path = out / run_id / "results.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    with open(work / f"{name}.log", "w+") as log:
        proc = subprocess.Popen(eval_command(inst, preds, work / "repos", run_id, out, workers=2, timeout=60),
                                cwd=ROOT, env=eval_env(None, tmp), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_lines(res_path, 1, 180, proc)
            deadline = time.monotonic() + 60
            while not containers_of(run_id) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            in_flight = len(containers_of(run_id))
            proc.send_signal(sig)
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        text = log.read()
    if rc != 130:
        problems.append(f"{name}: exit {rc}, expected 130: {text[-1000:]}")
    if "Traceback" in text:
        problems.append(f"{name}: a traceback was printed: {text[-1500:]}")
    left = containers_of(run_id)
    if left:
        problems.append(f"{name}: containers left behind: {left}")
    first = _check_lines(res_path, ids, problems, name)
    leftovers = sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []
    if leftovers:
        problems.append(f"{name}: temp dirs left behind: {leftovers}")
    again = gagar_eval(inst, preds, work / "repos", run_id, out, workers=2, timeout=60, tmpdir=tmp)
    final = _check_lines(res_path, ids, problems, f"{name} resume")
    if again.rc != 0 or {str(r["rollout_id"]): r["status"] for r in final} != {i: "resolved" for i in ids}:
        problems.append(f"{name} resume: exit {again.rc}, results {[(r['rollout_id'], r['status']) for r in final]}")
    return {"problems": problems, "in_flight_at_signal": in_flight, "done_before_signal": len(first),
            "lost": n - len(final)}


def report_dir_errors(work: Path) -> dict:
    """A report dir that cannot be used must give exit 2 (or 1 mid-run) and a message naming it, no traceback."""
    work = Path(work)
    problems: list[str] = []
    fortress = Fortress(work / "repos")
    inst = work / "instances.jsonl"
    inst.write_text(json.dumps(fortress.instance()) + "\n")
    preds = work / "predictions.jsonl"
    flood = fortress.calc_patch("import sys\nsys.stdout.write('z' * (3 << 20))\nreturn a + b")
    preds.write_text("".join(json.dumps({"instance_id": fortress.instance()["instance_id"], "rollout_id": f"r{i}",
                                         "model_patch": p}) + "\n"
                             for i, p in enumerate([fortress.gold, flood, fortress.gold, flood])))
    tried = 0
    rid = f"rdir-{os.getpid()}"

    def expect_clear(run, what: str, path: Path, codes=(1, 2)) -> None:
        if run.rc not in codes or "Traceback" in run.stderr or str(path) not in run.stderr:
            problems.append(f"{what}: exit {run.rc}, expected {codes} and a message naming {path}: "
                            f"{run.stderr.strip()[-800:]!r}")

    blocker = work / "not-a-dir"
    blocker.write_text("a file where the report dir should be\n")
    expect_clear(gagar_eval(inst, preds, work / "repos", rid, blocker, tmpdir=work / "tmp"), "report dir is a file",
                 blocker, (2,))
    tried += 1
    mounts: list[Path] = []
    try:
        ro = work / "ro"
        ro.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "gagar-ro", str(ro)],
                          capture_output=True).returncode == 0:
            mounts.append(ro)
            expect_clear(gagar_eval(inst, preds, work / "repos", rid, ro, tmpdir=work / "tmp"),
                         "read-only report dir", ro, (2,))
            tried += 1
        full = work / "full"
        full.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "gagar-full", str(full)],
                          capture_output=True).returncode == 0:
            mounts.append(full)
            run = gagar_eval(inst, preds, work / "repos", rid, full, tmpdir=work / "tmp")
            expect_clear(run, "report dir fills up mid-run", full)
            if "No space left" not in run.stderr and "full" not in run.stderr.lower():
                problems.append(f"report dir fills up mid-run: the message does not say the disk is full: "
                                f"{run.stderr.strip()[-500:]!r}")
            tried += 1
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
    if containers_of(rid):
        problems.append(f"containers left behind: {containers_of('r')}")
    leftovers = sorted(p.name for p in (work / "tmp").iterdir()) if (work / "tmp").exists() else []
    if leftovers:
        problems.append(f"temp dirs left behind: {leftovers}")
    return {"problems": problems, "cases": tried}


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
