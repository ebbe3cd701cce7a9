"""The task factory, project by project: source → baseline → candidates → screen → repeat → tasks.

Everything a run decides is replayed from what it recorded: the repositories are deterministic, the candidates'
order is fixed by the seed, and the sandbox's `results.jsonl` (one per project, under `<out>/work/`) keeps every
finished run, so a re-run after an interrupt evaluates only what is missing and writes the same tasks. A project
that cannot give tasks (no sdist, no tests, an install that fails, tests that need the network) is reported with
its reason and the run goes on.

Candidates are screened in batches, in the seed's order, and repeated in that order; the tasks of a project are
the first `max_tasks` valid candidates in that order, so the set does not depend on batch sizes or timing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.jsonl import atomic_write_text
from sandbox.records import EvalResult, Instance, Prediction
from synth import sources as src_mod
from synth import validate as val
from synth.mutate import KINDS, Mutation, find_mutations
from synth.order import Checker, iter_candidates
from synth.statement import Leak, problem_statement, stable_messages

FORMAT = 1
INFRA_RETRIES = 2  # extra evaluations of the runs the sandbox failed (infra_error) before they count


@dataclass
class Options:
    out: Path
    seed: int = 0
    max_tasks: int = 50  # per project
    max_fail: int = 50  # K: a bug that breaks more tests than this is too loud to be a task
    repeats: int = 3
    per_function: int = 3
    kinds: tuple[str, ...] = KINDS
    max_workers: int = 2
    timeout: float = 300.0  # wall seconds per test run (the groups' runs get less: see `_group_timeout`)
    cpu_limit: int = val.CPU_LIMIT_S  # CPU seconds per test process in a task's command
    heldout: float = 0.25  # share of repositories held out
    env_specs: dict | None = None
    progress: bool = True
    stop: threading.Event = field(default_factory=threading.Event)  # set: every evaluation ends early
    lane_workers: int = 1  # containers per project when projects run side by side (set by `synthesize`)

    def settings(self) -> dict[str, Any]:
        return {"seed": self.seed, "max_tasks": self.max_tasks, "max_fail": self.max_fail, "repeats": self.repeats,
                "per_function": self.per_function, "kinds": list(self.kinds), "heldout": self.heldout,
                "cpu_limit": self.cpu_limit}


@dataclass
class Candidate:
    index: int  # position in the seed's order: the task's number
    mutation: Mutation
    group: val.Group
    commit: str = ""
    patch: str = ""  # base → broken (the screening rollout)
    fail: list[str] = field(default_factory=list)
    survived: bool = False  # its first run broke 1..K tests
    dropped: str | None = None  # why it is not a task (None: still in the running, or valid)
    verdict: dict[str, Any] | None = None


@dataclass
class ProjectRun:
    source: src_mod.Source
    repo: str
    status: str = "skipped"
    reason: str | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    base_commit: str | None = None
    sha256: str | None = None
    spec: dict[str, Any] | None = None  # the environment spec used (before the coverage pins): the manifest's `env`


def _say(opts: Options, msg: str) -> None:
    if opts.progress:
        print(msg, file=sys.stderr, flush=True)


class Interrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM): a project's pipeline ends where it is; a re-run resumes it."""


class _Project:
    """One project's pipeline state (see the module docstring)."""

    def __init__(self, prepared: src_mod.Prepared, env: dict[str, Any], opts: Options) -> None:
        self.p, self.env, self.opts = prepared, env, opts
        self.work = opts.out / "work" / prepared.repo.replace("/", "__")
        self.run_dir = self.work / "runs"
        self.run_id = "synth-" + prepared.repo.replace("/", "__")
        self.instances: dict[str, Instance] = {}
        self.preds: dict[tuple[str, str], Prediction] = {}
        self.results: dict[tuple[str, str], EvalResult] = {}
        self.new_runs = 0
        self.groups: dict[tuple[str, str], val.Group] = {}
        self.repeated_groups: set[str] = set()
        self.suite_runs: list[EvalResult] = []
        self.baseline_run: EvalResult | None = None
        self.passing: set[str] = set()
        self.baseline_flaky: list[str] = []
        self.base_times: dict[str, float] = {}

    def evaluate(self, timeout: float) -> None:
        from sandbox.report import read_results
        from sandbox.run import evaluate_predictions

        todo = [p for k, p in self.preds.items() if k not in self.results]
        if not todo:
            return
        recorded = read_results(self.run_dir / "results.jsonl", warn=False)
        reused = {k for k, r in recorded.items() if r.status != "infra_error"}  # infra errors are retried
        if self.opts.stop.is_set():
            raise Interrupted
        config = val.sandbox_config(self.p.clone.parent, timeout=timeout, max_workers=self.opts.lane_workers,
                                    run_id=self.run_id)
        # The factory's runs derive FAIL_TO_PASS from the test statuses (the candidates have none yet): a
        # measurement, not a verdict, so the sandbox's refusal of instances without it does not apply.
        # A run the sandbox failed (an image build cut short, the engine) says nothing about the bug: decided on,
        # it would drop a candidate in one synthesis and keep it in the next. It is retried (the sandbox redoes
        # only infra errors) before anything is decided; one that fails every time is decided as it stands.
        for attempt in range(1 + INFRA_RETRIES):
            got = evaluate_predictions(self.instances, list(self.preds.values()), config, run_dir=self.run_dir,
                                       progress=False, stop=self.opts.stop, require_fail_to_pass=False,
                                       incremental=True)  # a growing set; a re-run finds its earlier runs there
            if self.opts.stop.is_set():
                raise Interrupted
            self.results = {r.key: r for r in got}
            broken = [r for p in todo if (r := self.results.get((p.instance_id, p.rollout_id)))
                      and r.status == "infra_error"]
            if not broken or attempt == INFRA_RETRIES:
                break
            _say(self.opts, f"{self.p.repo}: the sandbox failed {len(broken)} run(s), not their tests (e.g. "
                            f"{broken[0].instance_id} {broken[0].rollout_id}: {(broken[0].error or '')[:300]}); "
                            "retrying them")
        self.new_runs += sum(1 for p in todo if (p.instance_id, p.rollout_id) in self.results
                             and (p.instance_id, p.rollout_id) not in reused)

    def baseline(self) -> val.Baseline:
        inst = val.baseline_instance(self.p, self.env, self.run_id)
        self.instances[inst.instance_id] = inst
        pred = Prediction(inst.instance_id, val.NOOP_PATCH, "gagar-synth", "baseline")
        self.preds[pred.instance_id, pred.rollout_id] = pred
        self.evaluate(self.opts.timeout)
        res = self.results.get((pred.instance_id, pred.rollout_id))
        if res is None:
            return val.Baseline(error="the baseline run did not finish")
        base = val.read_baseline(res)
        self.baseline_run = res
        n_suite = self.opts.repeats - 2  # the clean tree's repeats: this run, these, and each group's own run
        if base.error or n_suite < 1:
            return base
        suite = val.suite_instance(self.p, self.env, base)
        self.instances[suite.instance_id] = suite
        keys = [(suite.instance_id, f"clean-{k}") for k in range(2, 2 + n_suite)]
        for iid, rid in keys:
            self.preds[iid, rid] = Prediction(iid, val.NOOP_PATCH, "gagar-synth", rid)
        self.evaluate(self.opts.timeout)
        self.suite_runs = [self.results[k] for k in keys if k in self.results]
        if len(self.suite_runs) < n_suite:
            base.error = "the repeats of the whole suite did not finish"
        self.baseline_flaky = val.drop_flaky_baseline(base, self.suite_runs)
        return base

    def group(self, base: val.Baseline, m: Mutation) -> val.Group:
        key = (m.path, m.function)
        if key not in self.groups:
            g = val.group_for(self.p, base, self.env, m.path, m.function, m.func_lines, self.opts.cpu_limit)
            self.groups[key] = g
            self.instances[g.gid] = g.instance
            self.instances[g.clock.instance_id] = g.clock
        return self.groups[key]

    def bug_run(self, c: Candidate, k: int) -> tuple[str, str]:
        """The (instance, rollout) of a bug's k-th run: the last repeat runs under the shifted clock."""
        iid = c.group.clock.instance_id if k == self.opts.repeats and k > 1 else c.group.gid
        return iid, f"bug-{c.mutation.key}-{k}"

    def clean_run(self, c: Candidate) -> tuple[str, str]:
        """The group's own clean run, under the shifted clock (the baseline and suite runs see the real one)."""
        return c.group.clock.instance_id, "clean-1"

    def screen(self, batch: list[Candidate], timeout: float) -> None:
        changes = {c.mutation.key: (c.mutation.path, c.mutation.apply(self.p.sources[c.mutation.path]))
                   for c in batch}
        commits = src_mod.write_commits(self.p, changes, "refs/synth/candidates/")
        patches = src_mod.diffs(self.p, commits)
        for c in batch:
            c.commit, c.patch = commits[c.mutation.key], patches[c.mutation.key]
            pred = val.bug_prediction(c.group.gid, c.mutation.key, c.patch, 1)
            self.preds[pred.instance_id, pred.rollout_id] = pred
        self.evaluate(timeout)
        for c in batch:
            c.fail, c.dropped = val.screen_verdict(self.results.get(self.bug_run(c, 1)),
                                                   self.opts.max_fail, self.base_times)
            c.survived = c.dropped is None

    def repeat(self, batch: list[Candidate], timeout: float) -> None:
        r = self.opts.repeats
        for c in batch:
            for k in range(2, r + 1):
                pred = val.bug_prediction(self.bug_run(c, k)[0], c.mutation.key, c.patch, k)
                self.preds[pred.instance_id, pred.rollout_id] = pred
            if c.group.gid not in self.repeated_groups:
                self.repeated_groups.add(c.group.gid)
                pred = val.clean_prediction(self.clean_run(c)[0], 1)
                self.preds[pred.instance_id, pred.rollout_id] = pred
        self.evaluate(timeout)
        for c in batch:
            bug = [self.results.get(self.bug_run(c, k)) for k in range(1, r + 1)]
            clean = [self.results.get(self.clean_run(c)), val.project(self.baseline_run, c.group.tests, self.passing),
                     *(val.project(s, c.group.tests) for s in self.suite_runs)]
            if any(x is None for x in [*bug, *clean]):
                c.dropped = "repeats did not finish"
                continue
            if any(val.cpu_killed(x) for x in [*bug, *clean]):
                c.dropped = "cpu limit: a repeat used up the command's CPU seconds"
                continue
            c.verdict = val.repeat_verdict(c.group, c.fail, c.patch, bug, clean)  # type: ignore[arg-type]
            if not c.verdict["valid"]:
                c.dropped = "flaky" if c.verdict["task_flaky"] else "; ".join(c.verdict["reasons"])[:300]


def _candidates(prepared: src_mod.Prepared, base: val.Baseline, opts: Options, stats: dict[str, Any]):
    muts = [m for path in sorted(prepared.sources) for m in find_mutations(path, prepared.sources[path], opts.kinds)]
    counts = {m.key: val.covering(m, base) for m in muts}
    # Only tests that execute a line can fail because of it: a line fewer than K tests run can never break too
    # many, and one that more than 2K tests run nearly always does (measured on tabulate: 170-208 of 195-239).
    cov = [m for m in muts if 0 < counts[m.key] <= 2 * opts.max_fail]
    stats["candidates"] = {"found": len(muts), "covered": sum(1 for n in counts.values() if n),
                           "too_central": sum(1 for n in counts.values() if n > 2 * opts.max_fail),
                           "tried_from": len(cov), "by_kind": dict(Counter(m.kind for m in cov))}
    return iter_candidates(cov, opts.seed, Checker(prepared.sources), per_function=opts.per_function,
                           kinds=opts.kinds)


def _group_timeout(opts: Options) -> float:
    """The wall-clock limit of a group's runs. It is not taken from the baseline's duration: that is timed under
    whatever load there is, and a bug whose run took 21-43 s was killed by one synthesis and kept by the next.
    An endless loop stops at the CPU limit, a bug that makes tests wait is dropped as `slow`, so this limit is a
    backstop: five times the CPU limit, which a process at its CPU limit meets with a fifth of a core."""
    return min(opts.timeout, 5.0 * opts.cpu_limit) if opts.cpu_limit else opts.timeout


def run_project(source: src_mod.Source, opts: Options) -> ProjectRun:
    """One project from source to tasks; a project that cannot give tasks comes back `skipped` with the reason."""
    out = ProjectRun(source, source.repo_name())
    try:
        return _run_project(out, opts)
    except (src_mod.SourceError, OSError) as exc:  # a git or file failure in this project: the others go on
        out.status, out.tasks, out.meta = "skipped", [], []
        out.reason = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
        _say(opts, f"{out.repo}: skipped — {out.reason}")
        return out


def _run_project(out: ProjectRun, opts: Options) -> ProjectRun:
    t0 = time.monotonic()
    source = out.source
    state_path = opts.out / "work" / out.repo.replace("/", "__") / "state.json"
    try:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except (OSError, ValueError):
        state = {}
    try:
        prepared = src_mod.prepare(source, opts.out, state)
    except src_mod.SourceError as exc:
        out.reason = str(exc)
        _say(opts, f"{out.repo}: skipped — {out.reason}")
        return out
    out.base_commit, out.sha256 = prepared.base_commit, prepared.sha256
    atomic_write_text(state_path, json.dumps({"base_commit": prepared.base_commit, "sha256": prepared.sha256}) + "\n")
    spec = source.env
    if spec is None and opts.env_specs:
        from sandbox.env.spec import spec_for

        found = spec_for(Instance("", out.repo, "", "", "", [], [], version=prepared.version), opts.env_specs)
        spec = found.to_dict() if found else None
    out.spec = spec
    env = val.env_for(prepared, spec)
    proj = _Project(prepared, env, opts)
    _say(opts, f"{out.repo}: baseline (whole suite under coverage)")
    base = proj.baseline()
    proj.passing = base.passing
    stats: dict[str, Any] = {"baseline": {"passing": len(base.passing), "failing": len(base.failing),
                                          "flaky": len(proj.baseline_flaky), "duration_s": round(base.duration_s, 2)}}
    out.stats = stats
    if base.error:
        out.reason = base.error
        _say(opts, f"{out.repo}: skipped — {out.reason}")
        stats["runs"] = proj.new_runs
        stats["wall_s"] = round(time.monotonic() - t0, 1)
        return out
    order = _candidates(prepared, base, opts, stats)
    proj.base_times = base.times
    timeout = _group_timeout(opts)
    screened: list[Candidate] = []
    repeated: set[int] = set()
    exhausted = False
    while True:
        valid = [c for c in screened if c.verdict and c.verdict["valid"]]
        need = opts.max_tasks - len(valid)
        if need <= 0:
            break
        pending = [c for c in screened if c.dropped is None and c.index not in repeated]
        if pending:
            batch = pending[:max(1, math.ceil(need * 1.2))]
            repeated.update(c.index for c in batch)
            _say(opts, f"{out.repo}: repeating {len(batch)} candidates ({len(valid)}/{opts.max_tasks} valid)")
            proj.repeat(batch, timeout)
            continue
        if exhausted:
            break
        # Share of screened candidates that end valid: 0.6-0.75 on the committed projects (the first guess).
        rate = (len(valid) + 1) / (len(screened) + 2) if screened else 0.65
        size = max(4, math.ceil(need / max(rate, 0.1) * 1.15))
        batch = []
        for m in itertools.islice(order, size):
            batch.append(Candidate(len(screened) + len(batch), m, proj.group(base, m)))
        exhausted = len(batch) < size
        if not batch:
            break
        _say(opts, f"{out.repo}: screening {len(batch)} candidates ({len(valid)}/{opts.max_tasks} valid)")
        proj.screen(batch, timeout)
        screened += batch
    _finish(out, proj, screened, stats, opts)
    stats["runs"] = proj.new_runs
    stats["wall_s"] = round(time.monotonic() - t0, 1)
    _say(opts, f"{out.repo}: {len(out.tasks)} tasks ({stats['runs']} test runs, {stats['wall_s']:.0f} s)"
         if out.tasks else f"{out.repo}: no task — {out.reason}")
    return out


def _finish(out: ProjectRun, proj: _Project, screened: list[Candidate], stats: dict[str, Any],
            opts: Options) -> None:
    p = proj.p
    valid = [c for c in screened if c.verdict and c.verdict["valid"]][:opts.max_tasks]
    prefix = p.repo.replace("/", "__")
    ids = {c.index: f"{prefix}-synth-{c.index}" for c in valid}
    commits = src_mod.write_commits(p, {ids[c.index]: (c.mutation.path, c.mutation.apply(p.sources[c.mutation.path]))
                                        for c in valid}, src_mod.TASK_REFS)
    reverts = src_mod.diffs(p, commits, reverse=True)
    src_mod.drop_refs(p, [f"refs/synth/candidates/{c.mutation.key}" for c in screened])
    for c in valid:
        iid = ids[c.index]
        assert commits[iid] == c.commit, "a task's commit must be the candidate's"
        v = c.verdict or {}
        runs = [proj.results.get(proj.bug_run(c, k)) for k in range(1, opts.repeats + 1)]
        messages = stable_messages([val.failure_messages(Path(r.log_path or "") / "report") for r in runs if r])
        try:
            statement = problem_statement(p.repo.split("/", 1)[1], v["FAIL_TO_PASS"], messages, reverts[iid])
        except Leak as exc:
            c.dropped, c.verdict = f"leak: {exc}", None
            continue
        out.tasks.append({
            "instance_id": iid, "repo": p.repo, "base_commit": c.commit, "patch": reverts[iid], "test_patch": "",
            "FAIL_TO_PASS": v["FAIL_TO_PASS"], "PASS_TO_PASS": v["PASS_TO_PASS"], "problem_statement": statement,
            "version": p.version, "environment_setup_commit": p.base_commit, "env": proj.env,
            "test_cmd": c.group.instance.test_cmd, "test_framework": "pytest", "language": "python"})
        out.meta.append({"instance_id": iid, "repo": p.repo, "kind": c.mutation.kind, "path": c.mutation.path,
                         "function": c.mutation.function, "lines": list(c.mutation.lines), "candidate": c.index,
                         "key": c.mutation.key, "flaky_tests_dropped": len([t for t in v["flaky"]
                                                                            if t not in v["task_flaky"]])})
    out.status = "ok" if out.tasks else "skipped"
    if not out.tasks:
        out.reason = f"no valid task among {len(screened)} screened candidates"
    kinds: dict[str, Counter] = {}
    for c in screened:
        k = kinds.setdefault(c.mutation.kind, Counter())
        k["screened"] += 1
        k["survived_screen"] += c.survived
        k["valid"] += bool(c.verdict and c.verdict["valid"])
    for m in out.meta:
        kinds[m["kind"]]["tasks"] += 1
    reasons = Counter(_reason_class(c.dropped) for c in screened if c.dropped)
    stats.update({
        "screened": len(screened), "repeated": sum(1 for c in screened if c.verdict is not None),
        "valid": sum(1 for c in screened if c.verdict and c.verdict["valid"]), "tasks": len(out.tasks),
        "dropped_flaky": reasons.get("flaky", 0), "dropped": dict(reasons),
        "p2p_flaky_tests_dropped": sum(m["flaky_tests_dropped"] for m in out.meta),
        "by_kind": {k: dict(v) for k, v in sorted(kinds.items())}, "groups": len(proj.groups),
        "container_runs_total": len(proj.results)})


def _reason_class(reason: str) -> str:
    for prefix in ("no test fails", "breaks", "timeout", "flaky", "leak", "suspicious", "infra_error", "patch_failed",
                   "rejected", "empty_patch", "resources", "cpu limit", "slow"):
        if reason.startswith(prefix):
            return prefix if prefix != "breaks" else "breaks too many tests"
    return "other"


def split_repos(runs: list[ProjectRun], seed: int, fraction: float) -> dict[str, list[str]]:
    """Held-out repositories: the ones a source marks `heldout`, then the last by a seeded hash until
    `round(fraction × repos)` (at least one when there are two or more) are held out."""
    repos = [r.repo for r in runs if r.tasks]
    forced = {r.repo: r.source.split for r in runs if r.tasks and r.source.split}
    k = max(1, round(fraction * len(repos))) if len(repos) >= 2 and fraction > 0 else 0
    held = [r for r, s in forced.items() if s == "heldout"]
    free = sorted((r for r in repos if r not in forced), key=lambda r: hashlib.sha256(f"{seed}:{r}".encode()).hexdigest())
    held += free[len(free) - max(0, k - len(held)):] if k > len(held) else []
    return {"train": sorted(r for r in repos if r not in held), "heldout": sorted(held)}


def write_outputs(runs: list[ProjectRun], opts: Options, wall_s: float) -> dict[str, Any]:
    """instances.jsonl, tasks_meta.jsonl, splits.json and manifest.json under `opts.out`, each atomically."""
    from sandbox.jsonl import write_jsonl_atomic

    tasks = [t for r in runs for t in r.tasks]
    write_jsonl_atomic(opts.out / "instances.jsonl", tasks)
    write_jsonl_atomic(opts.out / "tasks_meta.jsonl", [m for r in runs for m in r.meta])
    repos = split_repos(runs, opts.seed, opts.heldout)
    by_repo = {r.repo: [t["instance_id"] for t in r.tasks] for r in runs}
    splits = {"seed": opts.seed, "heldout_fraction": opts.heldout, "repos": repos,
              **{name: [i for repo in rs for i in by_repo[repo]] for name, rs in repos.items()}}
    atomic_write_text(opts.out / "splits.json", json.dumps(splits, indent=2) + "\n")
    kinds: dict[str, Counter] = {}
    for r in runs:
        for k, c in r.stats.get("by_kind", {}).items():
            kinds.setdefault(k, Counter()).update(c)
    screened = sum(r.stats.get("screened", 0) for r in runs)
    manifest = {
        "format": FORMAT, **opts.settings(),
        "sources": [{**r.source.to_dict(), "repo": r.repo, "sha256": r.sha256 or r.source.sha256, "env": r.spec,
                     "base_commit": r.base_commit, "status": r.status, "reason": r.reason, "stats": r.stats}
                    for r in runs],
        "totals": {"tasks": len(tasks), "projects_ok": sum(r.status == "ok" for r in runs),
                   "projects_skipped": sum(r.status != "ok" for r in runs), "screened": screened,
                   "by_kind": {k: dict(v) for k, v in sorted(kinds.items())},
                   "dropped_flaky": sum(r.stats.get("dropped_flaky", 0) for r in runs),
                   "container_runs": sum(r.stats.get("runs", 0) for r in runs), "wall_s": round(wall_s, 1)},
    }
    atomic_write_text(opts.out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def synthesize(sources: list[src_mod.Source], opts: Options) -> dict[str, Any]:
    """Every source's project, `opts.max_workers` projects at a time (each with its share of the containers:
    one project's builds and run tails overlap another's tests), then the output files. Ctrl-C or SIGTERM stops
    every project's evaluation (what finished is kept for the re-run) and raises KeyboardInterrupt."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    from sandbox.run import _signals_raise

    t0 = time.monotonic()
    lanes = max(1, min(opts.max_workers, len(sources)))
    opts.lane_workers = max(1, opts.max_workers // lanes)
    pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="gagar-synth")
    futures = []
    with _signals_raise(opts.stop):
        try:
            futures = [pool.submit(run_project, s, opts) for s in sources]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                for f in futures:
                    if f.done() and f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
        except BaseException:
            opts.stop.set()
            for f in futures:
                f.cancel()
            pool.shutdown(wait=True)
            raise
    pool.shutdown(wait=True)
    runs = [f.result() for f in futures]
    return write_outputs(runs, opts, time.monotonic() - t0)
