#!/usr/bin/env python3
"""Check the bundled tasks' expected verdicts by running every rollout, independently of `gagar eval`.

This is a verification tool for the task DATA, not a sandbox: it follows the same steps as SWE-bench
(apply the rollout, restore the task's test files, apply the test patch, run `test_cmd`, compare
FAIL_TO_PASS / PASS_TO_PASS) with none of the sandbox's isolation. Python tasks run on the host with the
current interpreter; Go and Java tasks (or all of them with --docker) run in the sandbox images with
`docker run`. Use it after editing a task:

    .venv/bin/python examples/check_tasks.py --tasks .gagar/tasks [--only acme__durations-42] [--docker]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath
from typing import Any

import unidiff

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox.integrity import gitsafe  # noqa: E402
from sandbox.jsonl import read_jsonl  # noqa: E402

IMAGES = {"python": "gagar-python:latest", "go": "gagar-go:latest", "java": "gagar-java:latest"}
_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def patch_paths(patch: str) -> list[str]:
    files = unidiff.PatchSet(patch)
    paths = []
    for f in files:
        for p in (f.source_file, f.target_file):
            if p and p != "/dev/null":
                paths.append(p[2:] if p[:2] in ("a/", "b/") else p)
    return paths


def unsafe_path(path: str) -> bool:
    pure = PurePosixPath(path)
    return pure.is_absolute() or ".." in pure.parts or (pure.parts[:1] == (".git",)) or path.startswith("/")


def _git(repo: Path, *args: str, input_text: str | None = None) -> gitsafe.GitResult:
    """The project's hardened git (`sandbox.integrity.gitsafe`) in this tool's own scratch copy."""
    return gitsafe.run(*args, cwd=repo, input=input_text)


def parse_results(framework: str, output: str, report_dir: Path) -> dict[str, bool]:
    """Map test id -> passed, per the contracts' test-id formats."""
    results: dict[str, bool] = {}
    if framework == "pytest":
        for line in output.splitlines():
            m = _PYTEST_LINE.match(line)
            if m:
                # A test reported twice (e.g. PASSED then ERROR at teardown) counts as failed.
                ok = m.group(1) in ("PASSED", "XFAIL")
                results[m.group(2)] = results.get(m.group(2), True) and ok
    elif framework == "go":
        for line in output.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("Test") and event.get("Action") in ("pass", "fail", "skip"):
                results[event["Test"]] = event["Action"] == "pass"
    elif framework == "junit":
        for xml in report_dir.glob("*.xml"):
            for case in ET.parse(xml).getroot().iter("testcase"):
                name = case.get("name", "").removesuffix("()")
                failed = any(case.find(tag) is not None for tag in ("failure", "error", "skipped"))
                results[f"{case.get('classname')}.{name}"] = not failed
    return results


def run_tests(instance: dict[str, Any], work: Path, docker: bool) -> tuple[str, Path]:
    report = Path(tempfile.mkdtemp(prefix="gagar-report-"))
    os.chmod(report, 0o777)
    cmd = instance["test_cmd"]
    if instance["language"] == "python" and not docker:
        env = {**os.environ, "GAGAR_REPORT_DIR": str(report), "PYTHONDONTWRITEBYTECODE": "1",
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
               "PYTEST_ADDOPTS": "-p no:cacheprovider"}
        proc = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        return proc.stdout + proc.stderr, report
    image = IMAGES[instance["language"]]
    env = ["-e", "HOME=/tmp", "-e", "GAGAR_REPORT_DIR=/gagar/report", "-e", "PYTEST_ADDOPTS=-p no:cacheprovider"]
    if instance["language"] == "go":
        env += ["-e", "GOCACHE=/tmp/gocache", "-e", "GOPATH=/tmp/go", "-e", "GOFLAGS=-mod=mod", "-e", "GOPROXY=off"]
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--label", "gagar.owner=tasks",
         "--user", f"{os.getuid()}:{os.getgid()}", "--tmpfs", "/tmp:exec", "-v", f"{work}:/testbed",
         "-v", f"{report}:/gagar/report", "-w", "/testbed", *env, image, "bash", "-c", cmd],
        capture_output=True, text=True, timeout=600,
    )
    return proc.stdout + proc.stderr, report


def evaluate(instance: dict[str, Any], patch: str, repos_dir: Path, docker: bool = False) -> dict[str, Any]:
    """Return {status, resolved, tampered_tests, failed} for one rollout."""
    verdict: dict[str, Any] = {"status": None, "resolved": False, "tampered_tests": False, "failed": []}
    if not patch.strip():
        return {**verdict, "status": "empty_patch"}
    try:
        paths = patch_paths(patch)
    except unidiff.UnidiffParseError:
        return {**verdict, "status": "patch_failed"}
    if any(unsafe_path(p) for p in paths):
        return {**verdict, "status": "rejected"}
    test_files = set(patch_paths(instance["test_patch"]))
    with tempfile.TemporaryDirectory(prefix="gagar-check-") as tmp:
        work = Path(tmp) / "testbed"
        shutil.copytree(repos_dir / instance["repo"].replace("/", "__"), work, symlinks=True)
        if not _git(work, "apply", "--check", "-", input_text=patch).ok:
            return {**verdict, "status": "patch_failed"}
        _git(work, "apply", "-", input_text=patch)
        verdict["tampered_tests"] = bool(test_files & set(paths))
        _git(work, "checkout", instance["base_commit"], "--", *sorted(test_files))
        if not _git(work, "apply", "-", input_text=instance["test_patch"]).ok:
            return {**verdict, "status": "infra_error"}
        output, report = run_tests(instance, work, docker)
        try:
            results = parse_results(instance["test_framework"], output, report)
        finally:
            shutil.rmtree(report, ignore_errors=True)
    wanted = instance["FAIL_TO_PASS"] + instance["PASS_TO_PASS"]
    verdict["failed"] = [t for t in wanted if not results.get(t, False)]
    verdict["resolved"] = not verdict["failed"]
    verdict["status"] = "resolved" if verdict["resolved"] else "unresolved"
    if not results:
        verdict["output_tail"] = output[-2000:]
    return verdict


def check(tasks_dir: Path, only: list[str] | None = None, docker: bool = False,
          languages: tuple[str, ...] = ("python", "go", "java")) -> list[str]:
    """Run every selected rollout; return one message per mismatch with expected.jsonl."""
    instances = {i["instance_id"]: i for i in read_jsonl(tasks_dir / "instances.jsonl")}
    patches = {(p["instance_id"], p["rollout_id"]): p["model_patch"]
               for p in read_jsonl(tasks_dir / "predictions.jsonl")}
    problems = []
    for exp in read_jsonl(tasks_dir / "expected.jsonl"):
        inst = instances[exp["instance_id"]]
        if (only and inst["instance_id"] not in only) or inst["language"] not in languages:
            continue
        got = evaluate(inst, patches[(exp["instance_id"], exp["rollout_id"])], tasks_dir / "repos", docker)
        if (got["status"], got["tampered_tests"]) != (exp["status"], exp["tampered_tests"]):
            problems.append(f"{exp['instance_id']} {exp['rollout_id']}: expected {exp['status']} "
                            f"(tampered={exp['tampered_tests']}), got {got['status']} "
                            f"(tampered={got['tampered_tests']}, failed={got['failed']})"
                            + (f"\n{got['output_tail']}" if "output_tail" in got else ""))
        if exp["kind"] == "wrong" and got["status"] == "unresolved" and not got["failed"]:
            problems.append(f"{exp['instance_id']} {exp['rollout_id']}: wrong rollout failed no test")
    return problems


def check_baseline(tasks_dir: Path, instance: dict[str, Any], docker: bool = False) -> list[str]:
    """At base + test patch, FAIL_TO_PASS must fail and PASS_TO_PASS must pass."""
    with tempfile.TemporaryDirectory(prefix="gagar-base-") as tmp:
        work = Path(tmp) / "testbed"
        shutil.copytree(tasks_dir / "repos" / instance["repo"].replace("/", "__"), work, symlinks=True)
        _git(work, "apply", "-", input_text=instance["test_patch"])
        output, report = run_tests(instance, work, docker)
        results = parse_results(instance["test_framework"], output, report)
        shutil.rmtree(report, ignore_errors=True)
    iid = instance["instance_id"]
    problems = [f"{iid}: F2P {t} passes at base" for t in instance["FAIL_TO_PASS"] if results.get(t)]
    problems += [f"{iid}: P2P {t} does not pass at base" for t in instance["PASS_TO_PASS"] if not results.get(t)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description="Verify the bundled tasks' expected verdicts.")
    parser.add_argument("--tasks", required=True, type=Path, help="the --out dir of build_tasks.py")
    parser.add_argument("--only", nargs="*", help="instance ids")
    parser.add_argument("--language", nargs="*", default=["python", "go", "java"])
    parser.add_argument("--docker", action="store_true", help="run Python tasks in gagar-python too")
    args = parser.parse_args(argv)
    if not (args.tasks / "instances.jsonl").is_file():
        print(f"check_tasks: {args.tasks}/instances.jsonl not found; run build_tasks.py first", file=sys.stderr)
        return 2
    problems = []
    for inst in read_jsonl(args.tasks / "instances.jsonl"):
        if (not args.only or inst["instance_id"] in args.only) and inst["language"] in args.language:
            problems += check_baseline(args.tasks, inst, args.docker)
    problems += check(args.tasks, args.only, args.docker, tuple(args.language))
    for p in problems:
        print(p)
    print("all rollouts as expected" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
