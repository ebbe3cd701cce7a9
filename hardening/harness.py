"""Run the corpus through the real `gagar eval` CLI (a subprocess, as a user would) and check from the host that
nothing got out: marker files, a TCP listener, the secret's text in any output, leftover processes, containers,
temp dirs, and the source repo itself.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hardening.corpus import Bait, Case, broken_predictions_file, build_corpus
from hardening.repo import git

ROOT = Path(__file__).resolve().parents[1]
MAX_WRITE = "256m"  # the corpus's cap on what tests may write into the work tree (fill_disk goes past it)
SLOW_TIMEOUT = 180  # seconds per test run for the Go and Java cases (a compile each)


def docker_reason() -> str | None:
    """None when the engine answers and the python image exists, else why not."""
    try:
        import docker

        c = docker.from_env(timeout=10)
        c.ping()
        c.images.get("gagar-python:latest")
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot run", with the reason shown
        return f"Docker sandbox not available ({exc}); run `make docker images`"
    return None


def containers_of(run_id: str, docker_host: str | None = None) -> list[str]:
    import docker

    c = docker.DockerClient(base_url=docker_host, timeout=30) if docker_host else docker.from_env(timeout=30)
    try:
        # The low-level list: the high-level one inspects each container and races with their removal.
        rows = c.api.containers(all=True, filters={"label": [f"gagar.run={run_id}"]})
        return sorted(r["Names"][0].lstrip("/") if r.get("Names") else r["Id"][:12] for r in rows)
    finally:
        c.close()


def host_ips() -> list[str]:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [ip for ip in out.split() if ":" not in ip]


class Listener:
    """A TCP listener on every host address; counts the connections that reach it (must stay 0)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.3)
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                continue
            self.peers.append(f"{addr[0]}:{addr[1]}")
            conn.close()

    def __enter__(self) -> Listener:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)
        self.sock.close()


@dataclass
class EvalRun:
    rc: int
    stderr: str
    peak_rss_mb: float
    wall_s: float
    results: list[dict]


def eval_command(instances: Path, predictions: Path, repos_dir: Path, run_id: str, report_dir: Path, *,
                 workers: int = 2, timeout: float = 20, memory: str = "512m",
                 extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "gagar.cli", "eval", "--instances", str(instances), "--predictions",
            str(predictions), "--repos-dir", str(repos_dir), "--run-id", run_id, "--report-dir", str(report_dir),
            "--max-workers", str(workers), "--timeout", str(timeout), "--memory", memory, "--no-progress",
            *(extra or [])]


def eval_env(env: dict[str, str] | None = None, tmpdir: Path | None = None) -> dict[str, str]:
    full = {**os.environ, **(env or {})}
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        full["TMPDIR"] = str(tmpdir)
    return full


def gagar_eval(instances: Path, predictions: Path, repos_dir: Path, run_id: str, report_dir: Path, *,
               workers: int = 2, timeout: float = 20, memory: str = "512m", extra: list[str] | None = None,
               env: dict[str, str] | None = None, tmpdir: Path | None = None,
               sample_rss: list[tuple[float, float]] | None = None) -> EvalRun:
    """Run `gagar eval` as a subprocess. Its peak memory is the largest VmHWM (the kernel's RSS high-water mark
    of the process's own address space) seen while it runs — not wait4's ru_maxrss, which on Linux carries over
    the parent's size across fork + exec. With `sample_rss`, (seconds, RSS MiB) samples are appended too."""
    args = eval_command(instances, predictions, repos_dir, run_id, report_dir, workers=workers, timeout=timeout,
                        memory=memory, extra=extra)
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, cwd=ROOT, env=eval_env(env, tmpdir), stdout=err, stderr=subprocess.STDOUT)
        samples = sample_rss if sample_rss is not None else []
        hwm = [0.0]
        sampler = threading.Thread(target=_sample, args=(proc.pid, t0, samples, hwm), daemon=True)
        sampler.start()
        _, status, _ = os.wait4(proc.pid, 0)
        sampler.join(2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    res_path = report_dir / run_id / "results.jsonl"
    results = [json.loads(x) for x in res_path.read_text().splitlines() if x.strip()] if res_path.exists() else []
    return EvalRun(proc.returncode, stderr, hwm[0], time.monotonic() - t0, results)


def _sample(pid: int, t0: float, out: list[tuple[float, float]], hwm: list[float]) -> None:
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        if "State:\tZ" in text:
            return
        fields = {ln.split(":")[0]: ln.split()[1] for ln in text.splitlines() if ln.startswith(("VmRSS", "VmHWM"))}
        if "VmRSS" in fields:
            out.append((round(time.monotonic() - t0, 2), int(fields["VmRSS"]) / 1024))
        if "VmHWM" in fields:
            hwm[0] = max(hwm[0], int(fields["VmHWM"]) / 1024)
        time.sleep(0.25)


@dataclass
class CaseOutcome:
    name: str
    category: str
    expected: list[str]
    status: str | None
    error: str | None
    duration_s: float | None
    problems: list[str] = field(default_factory=list)
    known_limit: bool = False
    suspicious: bool = False

    @property
    def contained(self) -> bool:
        return not self.problems


def _text_of(path: Path) -> bytes:
    out = b""
    for p in sorted(path.rglob("*")) if path.is_dir() else []:
        if p.is_file() and not p.is_symlink():
            out += p.read_bytes()
    return out


def _sleepers(tag: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines() if tag in ln]


def check_case(case: Case, r: dict | None, bait: Bait, run_dir: Path) -> CaseOutcome:
    o = CaseOutcome(case.name, case.category, list(case.status), r and r["status"], r and r.get("error"),
                    r and r.get("duration_s"), known_limit=case.known_limit)
    if r is None:
        o.problems.append("no result line (lost)")
        return o
    if r["status"] not in case.status:
        o.problems.append(f"status {r['status']!r}, expected {' or '.join(case.status)} ({r.get('error')})")
    if case.tampered is not None and r.get("tampered_tests") != case.tampered:
        o.problems.append(f"tampered_tests={r.get('tampered_tests')}, expected {case.tampered}")
    if case.suspicious is not None and bool(r.get("suspicious_report")) != case.suspicious:
        o.problems.append(f"suspicious_report={r.get('suspicious_report')}, expected {case.suspicious}")
    o.suspicious = bool(r.get("suspicious_report"))
    if case.error_contains and case.error_contains.lower() not in (r.get("error") or "").lower():
        o.problems.append(f"error {r.get('error')!r} does not mention {case.error_contains!r}")
    if case.max_duration_s and (r.get("duration_s") or 0) > case.max_duration_s:
        o.problems.append(f"took {r['duration_s']}s, over {case.max_duration_s:g}s")
    log = Path(r["log_path"]) if r.get("log_path") else None
    if log is not None and bait.secret.encode() in _text_of(log):
        o.problems.append("the host secret appears in the case's logs")
    if case.name == "output_flood" and log is not None:
        size = (log / "test_output.txt").stat().st_size
        if size > 1.3 * (1 << 20):
            o.problems.append(f"kept {size} bytes of output, over the 1 MiB cap")
    if _sleepers(bait.sleep_arg(case.name)):
        o.problems.append("its sleeping processes outlived the run: " + "; ".join(_sleepers(bait.sleep_arg(case.name))))
    return o


@dataclass
class CorpusReport:
    outcomes: list[CaseOutcome]
    global_problems: list[str]
    run: EvalRun
    inputs: dict
    infra_retried: list[str] = field(default_factory=list)

    def forging(self) -> dict:
        """Report-forging attempts (category `forge`): tried, detected (unresolved; how many flagged
        suspicious_report), and the ones that still pass."""
        forge = [o for o in self.outcomes if o.category == "forge"]
        return {"tried": len(forge), "detected": sum(o.status != "resolved" for o in forge),
                "flagged_suspicious": sum(o.suspicious for o in forge),
                "remaining": sorted(o.name for o in forge if o.status == "resolved")}

    def summary(self) -> dict:
        counted = [o for o in self.outcomes if not o.known_limit]
        return {
            "cases_tried": len(self.outcomes) + self.inputs.get("cases", 0),
            "contained": sum(o.contained for o in counted) + self.inputs.get("contained", 0),
            "failed": [f"{o.name}: {'; '.join(o.problems)}" for o in counted if not o.contained]
            + self.inputs.get("problems", []) + self.global_problems,
            "known_limits": [f"{o.name}: status {o.status} ({'contained' if o.contained else 'not contained'})"
                             for o in self.outcomes if o.known_limit],
            "forging": self.forging(),
            "lost_results": sum(1 for o in self.outcomes if o.status is None),
            "peak_rss_mb": round(self.run.peak_rss_mb, 1),
            "wall_s": round(self.run.wall_s, 1),
            "infra_retried": self.infra_retried,
        }


def run_corpus(work: Path, *, workers: int = 2, timeout: float = 20.0, run_id: str | None = None) -> CorpusReport:
    """Build the corpus under `work`, evaluate it with `gagar eval`, and check every case and the host."""
    work = Path(work).resolve()
    run_id = run_id or f"hardening-{secrets.token_hex(3)}"
    with Listener() as lis:
        bait = Bait(host_dir=str(work), mark=secrets.token_hex(6), secret="SECRET-" + secrets.token_hex(16),
                    port=lis.port, host_ips=host_ips())
        corpus = build_corpus(work, bait, timeout=timeout)
        fortress = corpus["fortress"]
        head_before = git(fortress.path, "rev-parse", "HEAD")
        tmpdir = work / "tmp"
        retried: list[str] = []

        def evaluate(predictions: Path, rid: str, limit: float) -> EvalRun:
            def once() -> EvalRun:
                return gagar_eval(corpus["instances"], predictions, corpus["repos_dir"], rid, work / "out",
                                  workers=workers, timeout=limit, tmpdir=tmpdir, extra=["--max-write", MAX_WRITE])
            got = once()
            # As a user would: an infra_error says nothing about the patch, and re-running the same command
            # retries just those predictions. The retries are reported, so a host fault is never hidden.
            faulty = [str(r["rollout_id"]) for r in got.results if r.get("status") == "infra_error"]
            if faulty and got.rc == 0:
                retried.extend(faulty)
                again = once()
                again.wall_s += got.wall_s
                got = again
            return got

        run = evaluate(corpus["predictions"], run_id, timeout)
        # Go and Java forgers compile first (go build, javac: 10-60 s on a busy 2-core machine), so they get
        # their own run with a timeout that fits a compile; the probes need the short one.
        slow = evaluate(corpus["slow_predictions"], run_id + "-slow", max(timeout, SLOW_TIMEOUT))
        time.sleep(0.5)
        peers = list(lis.peers)
    run.results += slow.results
    run.rc = run.rc or slow.rc
    run.stderr += slow.stderr
    run.wall_s += slow.wall_s
    run.peak_rss_mb = max(run.peak_rss_mb, slow.peak_rss_mb)
    by_id = {str(r["rollout_id"]): r for r in run.results}
    outcomes = [check_case(c, by_id.get(c.name), bait, work / "out" / run_id) for c in corpus["cases"]]
    problems: list[str] = []
    if run.rc != 0:
        problems.append(f"gagar eval exited {run.rc}: {run.stderr[-2000:]}")
    if len(run.results) != len(corpus["cases"]):
        problems.append(f"{len(run.results)} result lines for {len(corpus['cases'])} predictions")
    left = containers_of(run_id) + containers_of(run_id + "-slow")
    if left:
        problems.append(f"containers left behind: {left}")
    if peers:
        problems.append(f"the host listener got connections from {peers}")
    escaped = sorted(p.name for p in bait.escaped_dir.iterdir())
    if escaped:
        problems.append(f"files written into the host folder: {escaped}")
    problems += [f"host marker created: {p}" for p in bait.host_markers() if os.path.lexists(p)]
    leftovers = sorted(p.name for p in tmpdir.iterdir()) if tmpdir.exists() else []
    if leftovers:
        problems.append(f"temp dirs left behind: {leftovers}")
    status = git(fortress.path, "status", "--porcelain", "--ignored")
    if status.strip() or git(fortress.path, "rev-parse", "HEAD") != head_before:
        problems.append(f"the source repo changed: {status[:500]}")
    if bait.secret in run.stderr:
        problems.append("the host secret appears in gagar's own output")
    inputs = run_broken_inputs(work, corpus, fortress, timeout)
    return CorpusReport(outcomes, problems, run, inputs, retried)


def run_broken_inputs(work: Path, corpus: dict, fortress, timeout: float) -> dict:
    """Predictions files that are broken in part (skipped lines, the rest evaluated) or wholly (empty)."""
    problems: list[str] = []
    preds = work / "broken-predictions.jsonl"
    expected = broken_predictions_file(preds, fortress)
    run = gagar_eval(corpus["instances"], preds, corpus["repos_dir"], "inputs", work / "out-inputs",
                     timeout=timeout, tmpdir=work / "tmp-inputs")
    got = {str(r["rollout_id"]): r["status"] for r in run.results}
    if run.rc != 0:
        problems.append(f"broken_json_lines: gagar eval exited {run.rc}: {run.stderr[-1500:]}")
    if got != expected:
        problems.append(f"broken_json_lines: evaluated {got}, expected exactly {expected}")
    for n in (2, 3, 4, 7):  # lines that are not JSON objects: the message must name the line
        if f"line {n}" not in run.stderr and f":{n}: " not in run.stderr:
            problems.append(f"broken_json_lines: no message names line {n} of the predictions file")
    if run.stderr.count("skipped") < 7:
        problems.append(f"broken_json_lines: {run.stderr.count('skipped')} 'skipped' messages for 7 bad lines")
    report = work / "out-inputs" / "inputs" / "report.json"
    if report.exists() and not json.loads(report.read_text()).get("skipped_input_lines"):
        problems.append("broken_json_lines: report.json does not list the skipped lines")
    empty = work / "empty-predictions.jsonl"
    empty.write_text("")
    run2 = gagar_eval(corpus["instances"], empty, corpus["repos_dir"], "empty", work / "out-inputs",
                      timeout=timeout, tmpdir=work / "tmp-inputs")
    if run2.rc != 2 or "no predictions" not in run2.stderr.lower():
        problems.append(f"empty_predictions_file: exit {run2.rc}, expected 2 with a 'no predictions' message "
                        f"({run2.stderr.strip()[-300:]!r})")
    return {"cases": 2, "contained": 2 - len({p.split(":")[0] for p in problems}), "problems": problems}
