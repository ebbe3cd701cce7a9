#!/usr/bin/env python3
"""Task-factory benchmark (not a timed test): `gagar tasks synth` over the committed sources, then an independent
`gagar validate --repeats 3` of every task it made.

    .venv/bin/python bench/tasks.py [--out DIR] [--max-workers 2] [--cold] [--no-check]
                                                              [--max-tasks N]
    .venv/bin/python bench/tasks.py check --out DIR [--sample N]   # the check alone
    .venv/bin/python bench/tasks.py compare A/instances.jsonl B/instances.jsonl    # `make tasks-synth`'s check
    .venv/bin/python bench/tasks.py margins DIR    # the screen's timing rules against a finished run's runs
    .venv/bin/python bench/tasks.py syntheses DIR DIR DIR [--note TEXT]   # several syntheses byte for byte

Runs the synthesis from `examples/synth/sources.json` + `env_specs.json` into an empty DIR (the sdists are
downloaded, the environment images reused when they exist: the figures say which), timing it and sampling the
load average; then validates the set with three repeats of the broken base and of the gold patch each (a task
whose verdict changes between them, or that is not valid, counts against the target); writes
bench/results/tasks.json and copies instances.jsonl, manifest.json, splits.json and tasks_meta.jsonl to
examples/synth/, where `make tasks-synth` reproduces them from the manifest. `--max-tasks` overrides the
sources file's tasks per project (a smaller run); `check` runs the 3-repeat validation of a finished run's set
(all of it, or the first N tasks of each project with `--sample N`) and adds it to bench/results/tasks.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sandbox.jsonl import atomic_write_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SYNTH = ROOT / "examples" / "synth"
RESULT = ROOT / "bench" / "results" / "tasks.json"
GAGAR = [sys.executable, "-m", "gagar"]


class LoadSampler(threading.Thread):
    """The 1-minute load average every `every` seconds while it runs."""

    def __init__(self, every: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples, self._halt = every, [], threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(round(os.getloadavg()[0], 2))
            self._halt.wait(self.every)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        s = sorted(self.samples) or [0.0]
        return {"min": s[0], "median": s[len(s) // 2], "max": s[-1], "samples": len(self.samples)}


def _env_images() -> set[str]:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                         text=True).stdout
    return {line for line in out.split() if line.startswith("gagar-env-pypi-")}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(a: Path, b: Path) -> int:
    """Same tasks (ids, base commits, patches, test lists, statements)? Prints the differences; exit 1 if any."""
    key = ("repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "test_cmd", "env", "version",
           "environment_setup_commit")
    ra, rb = ({r["instance_id"]: r for r in _rows(p)} for p in (a, b))
    both = sorted(set(ra) & set(rb))
    diff = [f"only in {a}: {i}" for i in sorted(set(ra) - set(rb))] + [f"only in {b}: {i}" for i in sorted(set(rb) - set(ra))]
    diff += [f"{i}: {k} differs" for i in both for k in key if ra[i].get(k) != rb[i].get(k)]
    # A statement quotes the tests' messages, which may print a set or dict in hash order: reported, not failed.
    texts = [i for i in both if ra[i].get("problem_statement") != rb[i].get("problem_statement")]
    for line in diff[:50]:
        print(line)
    print(f"{len(both)} tasks in both; {len(diff)} differences" + (" — reproduced exactly" if not diff else "")
          + (f"; {len(texts)} problem statements worded differently ({', '.join(texts[:5])})" if texts else ""))
    return 1 if diff else 0


def _untimed(x: Any) -> Any:
    """A manifest without its timings and load figures, which follow the machine, not the synthesis."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not (k.endswith("_s") or "wall" in k or "load" in k)}
    return [_untimed(v) for v in x] if isinstance(x, list) else x


def syntheses(dirs: list[Path]) -> dict:
    """Several finished syntheses of one manifest: are their outputs the same bytes, and did every project screen,
    repeat and drop the same candidates (the manifests apart from timings)?"""
    files = ("instances.jsonl", "tasks_meta.jsonl", "splits.json")
    missing = [str(d / f) for d in dirs for f in (*files, "manifest.json") if not (d / f).is_file()]
    if missing:
        raise SystemExit(f"bench/tasks.py syntheses: not a finished synthesis (missing {', '.join(missing[:3])}); "
                         "pass the --out dirs of `gagar tasks synth` runs that ended")
    digest = {f: sorted({hashlib.sha256((d / f).read_bytes()).hexdigest() for d in dirs}) for f in files}
    manifests = [json.loads((d / "manifest.json").read_text()) for d in dirs]
    same_work = all(_untimed(m) == _untimed(manifests[0]) for m in manifests)
    return {"syntheses": len(dirs), "tasks": [len(_rows(d / "instances.jsonl")) for d in dirs],
            "distinct_sha256": {f: len(v) for f, v in digest.items()},
            "sha256": {f: v[0] for f, v in digest.items() if len(v) == 1},
            "manifests_equal_apart_from_timings": same_work,
            "wall_s": [m["totals"].get("wall_s") for m in manifests],
            "identical": same_work and all(len(v) == 1 for v in digest.values())}


def _per_kind(manifest: dict) -> dict:
    out = {}
    for kind, c in sorted(manifest["totals"]["by_kind"].items()):
        screened = c.get("screened", 0)
        # valid per screened candidate: a lower bound, as screening stops once a project has its tasks and some
        # survivors are never repeated.
        out[kind] = {**{k: c.get(k, 0) for k in ("screened", "survived_screen", "valid", "tasks")},
                     "yield": round(c.get("valid", 0) / screened, 3) if screened else None}
    return out


def _per_project(manifest: dict) -> dict:
    out = {}
    for s in manifest["sources"]:
        st = s.get("stats", {})
        row = {"source": s.get("sdist") or s.get("path"), "sha256": s.get("sha256"), "status": s["status"],
               "tasks": st.get("tasks", 0), "screened": st.get("screened", 0), "repeated": st.get("repeated", 0),
               "valid": st.get("valid", 0), "test_runs": st.get("runs", 0), "wall_s": st.get("wall_s"),
               "baseline_tests": st.get("baseline", {}).get("passing"), "dropped": st.get("dropped", {})}
        if s["status"] != "ok":
            row["reason"] = s.get("reason")
        # yield: valid among the candidates whose fate was decided (dropped at the screen, or repeated); the
        # survivors of the last screen that the project no longer needed are not counted either way.
        survived = sum(c.get("survived_screen", 0) for c in st.get("by_kind", {}).values())
        decided = row["screened"] - (survived - row["repeated"])
        if decided:
            row["yield"] = round(row["valid"] / decided, 3)
        out[s["repo"]] = row
    return out


def margins(out: Path) -> dict:
    """How far the screen's two timing rules sit from the runs they judged (a verdict near its threshold could
    differ in another synthesis): the `slow` rule's per-test excess over `SLOW_FACTOR` x the baseline time, for
    the bugs it dropped and for every other screening run; the CPU limit against the longest run of a task."""
    from synth import validate as val

    tasks = {m["key"] for m in _rows(out / "tasks_meta.jsonl")}
    slow, other, task_runs, stopped = [], [], [], 0
    for results in sorted((out / "work").glob("*/runs/results.jsonl")):
        rows = _rows(results)
        base = next((r for r in rows if r["rollout_id"] == "baseline"), None)
        if base is None:
            continue
        base_times = val.test_times(Path(base["log_path"]) / "report")
        for r in rows:
            rid = r["rollout_id"]
            if not rid.startswith("bug-"):
                continue
            stopped += r.get("exit_code") == val.CPU_KILLED and rid.endswith("-1")
            if rid[4:].rsplit("-", 1)[0] in tasks:
                task_runs.append(r["duration_s"])
            if not rid.endswith("-1") or not r.get("log_path"):
                continue
            _, excess = val.wait_excess(val.test_times(Path(r["log_path"]) / "report"), base_times)
            (slow if excess > val.SLOW_EXTRA_S else other).append(excess)
    return {"slow_rule": f"a test takes > {val.SLOW_FACTOR:g} x its baseline time + {val.SLOW_EXTRA_S:g} s",
            "dropped_slow": len(slow), "smallest_excess_dropped_s": round(min(slow), 2) if slow else None,
            "largest_excess_kept_s": round(max(other), 2) if other else None, "screening_runs": len(slow) + len(other),
            "cpu_limit_s": val.CPU_LIMIT_S, "stopped_at_cpu_limit": stopped,
            "longest_run_of_a_task_s": round(max(task_runs), 2) if task_runs else None, "task_runs": len(task_runs)}


def check(out: Path, max_workers: int, sample: int | None, env: dict) -> dict:
    """`gagar validate --repeats 3` of the set in `out` (or of its first `sample` tasks per project)."""
    rows = _rows(out / "instances.jsonl")
    if sample is not None:
        per_repo: dict[str, list[dict]] = {}
        for r in rows:
            per_repo.setdefault(r["repo"], []).append(r)
        rows = [r for rs in per_repo.values() for r in rs[:sample]]
    instances = out / "check-instances.jsonl"
    instances.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sampler = LoadSampler()
    sampler.start()
    t1 = time.monotonic()
    subprocess.run([*GAGAR, "validate", "--instances", str(instances), "--repos-dir", str(out / "repos"), "--out",
                    str(out / "check"), "--repeats", "3", "--max-workers", str(max_workers)], check=True, env=env,
                   cwd=ROOT, stderr=subprocess.DEVNULL)
    report = json.loads((out / "check" / "validate_report.json").read_text())
    changed = sorted(set(report["invalid_ids"]) | set(report["flaky_instances"]))
    return {"repeats": 3, "wall_s": round(time.monotonic() - t1, 1), "instances": report["instances"],
            "of_tasks": len(_rows(out / "instances.jsonl")), "sample_per_project": sample,
            "valid": report["valid"], "verdict_changed_or_invalid": len(changed), "ids": changed[:50],
            "load": sampler.stop(), "reasons": {i: report["per_instance"][i]["reasons"] for i in changed[:20]}}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        return compare(Path(sys.argv[2]), Path(sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "syntheses":  # added to the results
        sp = argparse.ArgumentParser(allow_abbrev=False, prog="bench/tasks.py syntheses")
        sp.add_argument("dirs", type=Path, nargs="+", help="finished `gagar tasks synth` output dirs")
        sp.add_argument("--note", default="", help="how they ran (recorded as is)")
        sargs = sp.parse_args(sys.argv[2:])
        result = json.loads(RESULT.read_text())
        result["syntheses"] = {**syntheses(sargs.dirs), "note": sargs.note}
        result["targets"]["repeated syntheses identical"] = result["syntheses"]["identical"]
        atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["syntheses"], indent=2))
        return 0 if result["syntheses"]["identical"] else 1
    if len(sys.argv) > 2 and sys.argv[1] == "margins":  # of a finished run's work dir, added to the results
        result = json.loads(RESULT.read_text())
        result["screen_margins"] = margins(Path(sys.argv[2]))
        atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["screen_margins"], indent=2))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        cp = argparse.ArgumentParser(allow_abbrev=False, prog="bench/tasks.py check")
        cp.add_argument("--out", type=Path, required=True, help="the work dir of a finished run")
        cp.add_argument("--max-workers", type=int, default=2)
        cp.add_argument("--sample", type=int, help="check only the first N tasks of each project")
        cargs = cp.parse_args(sys.argv[2:])
        result = json.loads(RESULT.read_text())
        result["check"] = check(cargs.out, cargs.max_workers, cargs.sample, env)
        result["targets"]["zero tasks change verdict in 3 repeats"] = not result["check"]["verdict_changed_or_invalid"]
        atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result["check"].items() if k != "reasons"}, indent=2))
        return 0
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="work dir (default: a fresh temp dir)")
    ap.add_argument("--max-workers", type=int, default=2)
    ap.add_argument("--max-tasks", type=int, help="tasks per project (default: the sources file's)")
    ap.add_argument("--no-check", action="store_true", help="skip the 3-repeat validation of the set")
    ap.add_argument("--cold", action="store_true", help="remove the sources' environment images first")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gagar-bench-tasks-"))
    if args.cold:
        names = {"gagar-env-pypi-" + re.sub(r"[^a-z0-9]+", "-", s["sdist"].split("==")[0].lower())
                 for s in json.loads((SYNTH / "sources.json").read_text())["sources"]}
        gone = [ref for ref in _env_images() if ref.split(":")[0] in names]
        if gone:
            subprocess.run(["docker", "rmi", *gone], capture_output=True)
    before = _env_images()
    sampler = LoadSampler()
    sampler.start()
    t0 = time.monotonic()
    subprocess.run([*GAGAR, "tasks", "synth", "--sources", str(SYNTH / "sources.json"), "--env-specs",
                    str(SYNTH / "env_specs.json"), "--out", str(out), "--max-workers", str(args.max_workers),
                    *(["--max-tasks", str(args.max_tasks)] if args.max_tasks else [])],
                   check=True, env=env, cwd=ROOT)
    synth_s = time.monotonic() - t0
    load_synth = sampler.stop()
    manifest = json.loads((out / "manifest.json").read_text())
    tasks = manifest["totals"]["tasks"]
    repeated = sum(s.get("stats", {}).get("repeated", 0) for s in manifest["sources"])
    result = {
        "command": ".venv/bin/python bench/tasks.py" + (" --cold" if args.cold else "")
        + (f" --max-tasks {args.max_tasks}" if args.max_tasks else ""),
        "machine": {"cpus": os.cpu_count(), "load_during_synth": load_synth},
        "env_images": {"present_before": len(before & _env_images()), "built": len(_env_images() - before)},
        "synth": {"wall_s": round(synth_s, 1), "tasks": tasks, "max_tasks_per_project": manifest["max_tasks"],
                  "projects_ok": manifest["totals"]["projects_ok"],
                  "projects_skipped": manifest["totals"]["projects_skipped"],
                  "screened": manifest["totals"]["screened"], "test_runs": manifest["totals"]["container_runs"],
                  "s_per_task": round(synth_s / tasks, 2) if tasks else None,
                  "dropped_flaky": manifest["totals"]["dropped_flaky"],
                  "flaky_share_of_repeated": round(manifest["totals"]["dropped_flaky"] / repeated, 4) if repeated else None,
                  "p2p_flaky_tests_dropped": sum(s.get("stats", {}).get("p2p_flaky_tests_dropped", 0)
                                                 for s in manifest["sources"])},
        "targets": {"projects >= 6": manifest["totals"]["projects_ok"] >= 6, "tasks >= 300": tasks >= 300,
                    "synth <= 30 min": synth_s <= 1800},
        "per_project": _per_project(manifest),
        "per_kind": _per_kind(manifest),
        "screen_margins": margins(out),
    }
    if not args.no_check:
        result["check"] = check(out, args.max_workers, None, env)
        result["targets"]["zero tasks change verdict in 3 repeats"] = not result["check"]["verdict_changed_or_invalid"]
    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    for name in ("instances.jsonl", "manifest.json", "splits.json", "tasks_meta.jsonl"):
        shutil.copyfile(out / name, SYNTH / name)
    print(json.dumps({k: result[k] for k in ("synth", "targets", "env_images")}, indent=2))
    print(f"per kind: {json.dumps(result['per_kind'])}")
    print(f"→ {RESULT}; the set → {SYNTH}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
