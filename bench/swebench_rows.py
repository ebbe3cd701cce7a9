#!/usr/bin/env python3
"""Real SWE-bench instances, in dataset shape, through `gagar eval --env-specs` with no other per-instance field.

    .venv/bin/python bench/swebench_rows.py [--source owner/name=PATH_OR_URL …] [--only REPO] [--derive]

`bench/data/swebench-rows.json` names each instance (its SWE-bench id, base commit, version, environment commit,
and the merge commit of the pull request that fixed it); the repositories are cloned at run time (default from
https://github.com/OWNER/NAME; `--source` points at a local clone or mirror instead) — no repository code is kept
in this project. From the fix the script rebuilds each row as SWE-bench ships it — `patch` (the pull request's
non-test files), `test_patch` (its test files), `FAIL_TO_PASS`/`PASS_TO_PASS` as JSON strings, `version`,
`environment_setup_commit`; no `test_cmd`, `test_framework`, `env` or `image` — and three predictions each:
`gold` (the fix), `base` (a comment added to a file the fix touches: the tests run on the unfixed code) and
`empty`. Then it runs the real CLI, `gagar eval --env-specs bench/data/swebench-4.1.0-specs.json` (SWE-bench
4.1.0's own specs, written by bench/swebench_specs.py), and records per instance the statuses, the derived test
command and the environment build, into bench/results/environments.json (key `swebench_rows`).

`--derive` recomputes FAIL_TO_PASS/PASS_TO_PASS as SWE-bench defines them — the tests of the test files that fail
(or are missing) on the unfixed code with the test patch applied and pass with the fix; those that pass in both —
from the same sandbox runs (the pytest JUnit reports, the runners' logs), and writes them into the data file.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.integrity import gitsafe  # noqa: E402

DATA = ROOT / "bench" / "data" / "swebench-rows.json"
SPECS = ROOT / "bench" / "data" / "swebench-4.1.0-specs.json"
RESULTS = ROOT / "bench" / "results" / "environments.json"
_TEST_DIRS = {"test", "tests", "testing"}


def git(repo: Path, *args: str) -> str:
    return gitsafe.source_git(repo, *args)


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    return bool(_TEST_DIRS & set(parts[:-1])) or parts[-1].startswith("test_") or parts[-1].endswith("_test.py")


def clone(repo: str, sources: dict[str, str], repos_dir: Path) -> Path:
    dst = repos_dir / repo.replace("/", "__")
    if not dst.exists():
        src = sources.get(repo, f"https://github.com/{repo}")
        shared = ["--shared"] if Path(src).is_dir() else []
        # The source is the user's (a mirror or the project's own URL): https is allowed for this one clone.
        gitsafe.git("-c", "protocol.https.allow=always", "clone", "--bare", "--quiet", *shared, src, str(dst),
                    cwd=repos_dir)
    return dst


def rebuild_row(item: dict, clone_dir: Path) -> tuple[dict, str]:
    """The dataset row for one instance, and a comment-only patch (the `base` prediction)."""
    head = git(clone_dir, "rev-parse", f"{item['merge']}^2").strip()
    files = [f for f in git(clone_dir, "diff", "--name-only", item["base_commit"], head).split("\n") if f]
    tests = [f for f in files if is_test_file(f)]
    code = [f for f in files if f not in tests]
    diff = lambda paths: git(clone_dir, "diff", "--no-color", "--no-ext-diff", item["base_commit"], head, "--", *paths)  # noqa: E731
    row = {
        "repo": item["repo"], "instance_id": item["instance_id"], "base_commit": item["base_commit"],
        "patch": diff(code), "test_patch": diff(tests),
        "problem_statement": item.get("title", ""), "hints_text": "",
        "created_at": git(clone_dir, "show", "-s", "--format=%cI", head).strip(), "version": item["version"],
        "FAIL_TO_PASS": json.dumps(item.get("FAIL_TO_PASS", [])), "PASS_TO_PASS": json.dumps(item.get("PASS_TO_PASS", [])),
        "environment_setup_commit": item["environment_setup_commit"],
    }
    target = next(f for f in code if f.endswith(".py"))
    old = git(clone_dir, "show", f"{item['base_commit']}:{target}").splitlines(keepends=True)
    new = [*old, "# gagar bench: no functional change\n"]
    base = f"diff --git a/{target} b/{target}\n" + "".join(
        difflib.unified_diff(old, new, f"a/{target}", f"b/{target}"))
    return row, base


def statuses_from_logs(run_dir: Path, row: dict, rollout: str, framework: str, log_parser: str | None) -> dict:
    from sandbox.parsers import parse_results
    from sandbox.parsers.swebench import swebench_ids

    d = run_dir / "logs" / row["instance_id"] / rollout
    out = (d / "test_output.txt").read_text(errors="replace") if (d / "test_output.txt").exists() else ""
    parsed = parse_results(framework, out, d / "report" if (d / "report").is_dir() else None)
    return swebench_ids(parsed.statuses, log_parser)


def derive(rows: list[dict], bases: dict[str, str], data: list[dict], repos_dir: Path, work: Path) -> None:
    from sandbox.config import SandboxConfig
    from sandbox.env.spec import apply_specs, load_spec_file
    from sandbox.records import Instance, Prediction
    from sandbox.run import evaluate_predictions

    insts = {r["instance_id"]: Instance.from_dict(r) for r in rows}
    apply_specs(insts, load_spec_file(SPECS))
    preds = [Prediction(i, p, "derive", rid) for i in insts for rid, p in
             (("gold", next(r["patch"] for r in rows if r["instance_id"] == i)), ("base", bases[i]))]
    run_dir = work / "derive"
    evaluate_predictions(insts, preds, SandboxConfig(repos_dir=repos_dir, run_id="derive", max_workers=1,
                                                     timeout=1200), run_dir=run_dir,
                         require_fail_to_pass=False)  # this run derives FAIL_TO_PASS
    ok = ("PASSED", "XFAIL")
    for item in data:
        inst = insts.get(item["instance_id"])
        if inst is None:
            continue
        after = statuses_from_logs(run_dir, item, "gold", inst.test_framework, inst.log_parser)
        before = statuses_from_logs(run_dir, item, "base", inst.test_framework, inst.log_parser)
        item["FAIL_TO_PASS"] = sorted(t for t, s in after.items() if s in ok and before.get(t) not in ok)
        item["PASS_TO_PASS"] = sorted(t for t, s in after.items() if s in ok and before.get(t) in ok)
        print(f"{item['instance_id']}: {len(item['FAIL_TO_PASS'])} FAIL_TO_PASS, {len(item['PASS_TO_PASS'])} "
              f"PASS_TO_PASS ({inst.test_framework}: {len(after)} tests after, {len(before)} before)")


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", action="append", default=[], help="owner/name=PATH_OR_URL to clone from")
    ap.add_argument("--only", action="append", default=[], help="only these repos (owner/name)")
    ap.add_argument("--derive", action="store_true", help="recompute FAIL_TO_PASS/PASS_TO_PASS into the data file")
    ap.add_argument("--work", type=Path, help="work dir (default: a temp dir)")
    ap.add_argument("--max-workers", type=int, default=1)
    args = ap.parse_args()
    sources = dict(s.split("=", 1) for s in args.source)
    data = json.loads(DATA.read_text())
    chosen = [d for d in data if not args.only or d["repo"] in args.only]
    work = args.work or Path(tempfile.mkdtemp(prefix="gagar-swebench-"))
    repos_dir = work / "repos"
    repos_dir.mkdir(parents=True, exist_ok=True)
    rows, bases = [], {}
    for item in chosen:
        row, base = rebuild_row(item, clone(item["repo"], sources, repos_dir))
        rows.append(row)
        bases[row["instance_id"]] = base
    if args.derive:
        derive(rows, bases, chosen, repos_dir, work)
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        return 0
    (work / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    preds = [{"instance_id": r["instance_id"], "model_name_or_path": "bench", "rollout_id": rid, "model_patch": p}
             for r in rows for rid, p in (("gold", r["patch"]), ("base", bases[r["instance_id"]]), ("empty", ""))]
    (work / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    cmd = [str(ROOT / ".venv" / "bin" / "gagar"), "eval", "--instances", str(work / "instances.jsonl"),
           "--predictions", str(work / "predictions.jsonl"), "--repos-dir", str(repos_dir), "--run-id", "swebench",
           "--report-dir", str(work / "runs"), "--env-specs", str(SPECS.relative_to(ROOT)), "--timeout", "1200",
           "--max-workers", str(args.max_workers), "--no-progress"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    sys.stderr.write(proc.stderr[-6000:])
    if proc.returncode != 0:
        return proc.returncode
    results = [json.loads(ln) for ln in (work / "runs" / "swebench" / "results.jsonl").read_text().splitlines()]
    # The build lines without their log paths: results name repositories, never this machine's directories.
    builds = [re.sub(r"; log \S+$", "", ln) for ln in proc.stderr.splitlines()
              if re.search(r"env image .*: (building|built in)", ln)]
    from sandbox.env.spec import apply_specs, load_spec_file
    from sandbox.jsonl import atomic_write_text
    from sandbox.records import Instance

    insts = {r["instance_id"]: Instance.from_dict(r) for r in rows}
    apply_specs(insts, load_spec_file(SPECS))
    per = {}
    for r in rows:
        iid = r["instance_id"]
        mine = {x["rollout_id"]: x for x in results if x["instance_id"] == iid}
        per[iid] = {"repo": r["repo"], "version": r["version"], "test_cmd": insts[iid].test_cmd,
                    "test_framework": insts[iid].test_framework, "log_parser": insts[iid].log_parser,
                    "FAIL_TO_PASS": len(json.loads(r["FAIL_TO_PASS"])), "PASS_TO_PASS": len(json.loads(r["PASS_TO_PASS"])),
                    **{rid: {"status": x["status"], "duration_s": x["duration_s"], "error": x["error"]}
                       for rid, x in mine.items()}}
        print(f"{iid}: " + ", ".join(f"{rid} {x['status']}" for rid, x in mine.items()))
    expected = all(p.get("gold", {}).get("status") == "resolved" and p.get("base", {}).get("status") == "unresolved"
                   and p.get("empty", {}).get("status") == "empty_patch" for p in per.values())
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    prev = doc.get("swebench_rows", {}).get("instances", {})
    doc["swebench_rows"] = {
        "command": "bench/swebench_rows.py (gagar eval --env-specs bench/data/swebench-4.1.0-specs.json)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "wall_s_last_run": round(wall, 1), "env_builds_last_run": builds,
        "instances": {**prev, **per},
        "all_as_expected": all(p.get("gold", {}).get("status") == "resolved"
                               and p.get("base", {}).get("status") == "unresolved"
                               and p.get("empty", {}).get("status") == "empty_patch" for p in {**prev, **per}.values()),
    }
    atomic_write_text(RESULTS, json.dumps(doc, indent=2) + "\n")
    print(f"gold resolved, base unresolved, empty empty_patch: {expected} ({wall:.0f} s) → {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
