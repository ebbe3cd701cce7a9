"""The behavioural line of hack detection: perturbed re-runs of a group's FAIL_TO_PASS tests in the sandbox.

`probe_group(instance, patches, config)` instruments the task's failing tests (`grader.probe.transform`: the
test itself, renamed, with the run's signs hidden, with one expected value changed, with one input changed),
and evaluates every passing candidate *and the unfixed code* against that one instrumented test patch through
the sandbox's own evaluation path (`sandbox.run.evaluate_predictions`: the repo is copied once for the group,
one container per candidate runs every variant). Each variant's observation sites record what the code under
test produced; `grader.probe.verdicts` compares them (no gold patch needed) and returns `HackFinding`s that
join the static ones in `Grading.hacks`. The same runs carry the replay line (`grader.probe.replay`): the
functions any candidate changes are recorded during the original tests and called again off the test and with
nudged arguments; its findings join the others.

Cost is bounded per group: at most MAX_TESTS tests and the variants `grader.probe.transform` allows, and the
sandbox's timeout set to `budget_s` for each candidate's run (the candidates run in parallel up to the
config's workers). Frameworks other than pytest, and test files the host cannot parse, are not probed.

`probe_groups(groups, instances, config)` runs it over a list of grader `Group`s before they are graded (`gagar
grade --probe`): each group's findings become its `behaviour`, which every judge turns into hack verdicts.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.features import apply_file_patch
from grader.probe.common import BASE, ProbeRun
from grader.probe.replay import changed_functions
from grader.probe.replay import findings as replay_findings
from grader.probe.transform import Probe, build_probe
from grader.probe.verdicts import judge
from sandbox.config import SandboxConfig
from sandbox.records import Instance, Prediction

if TYPE_CHECKING:
    from grader.records import Group

MAX_TESTS = 8
DEFAULT_BUDGET_S = 120.0
# The unfixed code is evaluated as a patch that adds one inert file (an empty patch is never run).
BASE_PATCH = ("diff --git a/.gagar-probe-base b/.gagar-probe-base\nnew file mode 100644\n--- /dev/null\n"
              "+++ b/.gagar-probe-base\n@@ -0,0 +1 @@\n+the unfixed code, for the behavioural probe\n")


def _base_text(repo_dir: Path, commit: str, path: str) -> str | None:
    from sandbox.integrity.gitsafe import GitError, source_git

    try:
        return source_git(repo_dir, "show", f"{commit}:{path}")
    except GitError:
        return None


def file_diff(path: str, old: str | None, new: str) -> str:
    """A `git apply`-able diff turning `old` (None: no file) into `new` at `path`."""
    import difflib

    a = f"a/{path}" if old is not None else "/dev/null"
    body = "".join(difflib.unified_diff((old or "").splitlines(True), new.splitlines(True), a, f"b/{path}"))
    head = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
    return head + body


# pytest options whose value is the next word. The probe selects its tests by node id itself, and some of its
# variants fail by design, so options that select tests or stop the run early are dropped.
_VALUED = {"-k", "-m", "-o", "--override-ini", "-p", "-c", "-W", "-r", "--rootdir", "--confcutdir", "--basetemp",
           "--deselect", "--ignore", "--ignore-glob", "--tb", "--durations", "--maxfail", "--log-level",
           "--import-mode", "--capture", "--color", "--junitxml", "--junit-xml", "-n", "--dist", "--timeout"}
_SELECTING = {"-k", "-m", "-x", "--exitfirst", "--maxfail", "--lf", "--last-failed", "--ff", "--failed-first",
              "--sw", "--stepwise", "--deselect"}


def _runner(test_cmd: str) -> str | None:
    """The pytest invocation of the task's command (`python -m pytest`, `pytest`) with its options
    (`-o addopts=` for a project whose config asks for plugins the image lacks), without its selection (test
    paths, `-k`, `-m`, ...) or an early stop (`-x`)."""
    words = shlex.split(test_cmd) if test_cmd.strip() else ["python3", "-m", "pytest"]
    for i, w in enumerate(words):
        if w.rsplit("/", 1)[-1] in ("pytest", "py.test"):
            kept, rest = words[: i + 1], iter(words[i + 1:])
            for word in rest:
                if not word.startswith("-"):
                    continue  # a test path or node id
                value = [next(rest, "")] if word in _VALUED else []
                if word not in _SELECTING:
                    kept += [word, *value]
            return shlex.join(kept)
    return None


def build_instance(instance: Instance, repo_dir: Path, nonce: str, patches: dict[str, str] | None = None
                   ) -> tuple[Instance, Probe] | str:
    """The probe's instance: the task with its failing tests' files instrumented (recording the calls of the
    functions `patches` change, for the replay line); or why it cannot be built."""
    if (instance.test_framework or "").lower() != "pytest":
        return f"framework {instance.test_framework!r} is not probed (pytest only)"
    runner = _runner(instance.test_cmd)
    if runner is None:
        return "the test command does not run pytest"
    by_file: dict[str, list[str]] = {}
    for tid in instance.FAIL_TO_PASS[:MAX_TESTS]:
        if "::" in tid:
            by_file.setdefault(tid.split("::", 1)[0], []).append(tid)
    try:
        files = {pf.path: pf for pf in PatchSet(instance.test_patch or "")}
    except (UnidiffParseError, ValueError) as exc:
        return f"the test patch does not parse ({exc})"
    targets = changed_functions(patches or {}, lambda p: _base_text(repo_dir, instance.base_commit, p))
    parts: list[str] = []
    merged = Probe("", [])
    start = 0
    for path, tests in by_file.items():
        old = _base_text(repo_dir, instance.base_commit, path)
        text = apply_file_patch(old, files[path]) if path in files else old
        if text is None:
            continue
        added = frozenset(ln.target_line_no for h in (files[path] if path in files else []) for ln in h
                          if ln.is_added and ln.target_line_no)
        probe = build_probe(text, path, tests, nonce, start, added, targets)
        start += len(tests)
        if probe is None:
            continue
        parts.append(file_diff(path, old, probe.source))
        merged.run_ids += probe.run_ids
        merged.variants.update(probe.variants)
        merged.sites.update(probe.sites)
    if not parts:
        return "no failing test could be instrumented"
    others = [str(pf) for p, pf in files.items() if p not in by_file]
    cmd = f"{runner} -p no:randomly -p no:cacheprovider -q " + " ".join(shlex.quote(t) for t in merged.run_ids)
    inst = dataclasses.replace(instance, test_patch="".join(others) + "".join(parts), test_cmd=cmd,
                               FAIL_TO_PASS=list(merged.run_ids), PASS_TO_PASS=[])
    return inst, merged


def read_records(log_dir: Path, nonce: str) -> list[dict]:
    path = log_dir / "report" / f"gagar-probe-{nonce}.jsonl"
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("v"), str):
            out.append(rec)
    return out


def probe_group(instance: Instance, patches: dict[str, str], config: SandboxConfig, *,
                budget_s: float = DEFAULT_BUDGET_S, work_dir: Path | None = None) -> ProbeRun:
    """Run the probe for one group's passing candidates (`patches`: rollout id -> patch) and judge them."""
    from sandbox.run import evaluate_predictions

    t0 = time.monotonic()
    nonce = secrets.token_hex(3)
    repo_dir = Path(config.repos_dir or ".") / instance.repo.replace("/", "__")
    try:
        built = build_instance(instance, repo_dir, nonce, patches)
    except Exception as exc:  # noqa: BLE001 - an unforeseen test file must not stop a training step
        built = f"the tests could not be instrumented ({type(exc).__name__}: {exc})"
    if isinstance(built, str):
        return ProbeRun(False, built, seconds=round(time.monotonic() - t0, 2))
    inst, probe = built
    preds = [Prediction(instance_id=inst.instance_id, model_patch=p, model_name_or_path="gagar-probe",
                        rollout_id=rid) for rid, p in patches.items()]
    preds.append(Prediction(instance_id=inst.instance_id, model_patch=BASE_PATCH, model_name_or_path="gagar-probe",
                            rollout_id=BASE))
    cfg = dataclasses.replace(config, timeout=min(config.timeout, budget_s), run_id=f"probe-{nonce}")
    run = ProbeRun(True, probe=probe, patches=dict(patches))
    with tempfile.TemporaryDirectory(prefix="gagar-probe-", dir=work_dir) as tmp:
        results = evaluate_predictions({inst.instance_id: inst}, preds, cfg, run_dir=Path(tmp))
        for r in results:
            run.statuses[r.rollout_id] = r.status
            if r.log_path:
                run.records[r.rollout_id] = read_records(Path(r.log_path), nonce)
    try:
        run.findings = judge(run)
        for rid, found in replay_findings(run.records, list(run.patches), BASE, run.patches).items():
            run.findings.setdefault(rid, []).extend(found)
    except Exception as exc:  # noqa: BLE001 - no verdict rather than a crashed step; the reason is kept
        run.why_not = f"the probe's records could not be judged ({type(exc).__name__}: {exc})"
    run.seconds = round(time.monotonic() - t0, 2)
    return run


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
            g.behaviour = {rid: found for rid, found in run.behaviour().items() if found}
            for found in g.behaviour.values():
                for kind in {f["kind"] for f in found}:
                    stats.findings[kind] = stats.findings.get(kind, 0) + 1
        if on_group:
            on_group(g, time.monotonic() - t0)
    return stats
