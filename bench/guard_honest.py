#!/usr/bin/env python3
"""Does the pytest guard flag an honest suite? Real projects' own test suites, which the guard was not developed
on (held-out), run in their env images as the sandbox runs them (`PYTEST_ADDOPTS` with the JUnit report, the
plugin loaded first), once without the plugin and once with each plugin version given. A version passes a project
when every test keeps its status and the plugin sends no `tamper` record; each XFAIL's provenance and each
`conftest` record are counted too.

    .venv/bin/python bench/guard_honest.py --mirrors DIR --project pytoolz/toolz=gagar-env-pypi-toolz:TAG \
        [--project pallets/click=IMAGE,tests ...] [--guard before=/path/to/other/guest] [--out FILE] [--update]

After the image, comma-separated arguments for pytest (e.g. the test folder); a repository with a `src/` folder
gets it on PYTHONPATH, as an installed package would be. `--update` keeps the other projects of an earlier --out.

A project's source is the HEAD of a local clone `<mirrors>/<owner>+<name>/repo` (a snapshot of the project's
GitHub repository), exported through `sandbox.integrity.gitsafe`; the image supplies its dependencies. Writes
bench/results/guard_honest.json (or --out) and prints a line per project and version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.integrity import gitsafe  # noqa: E402
from sandbox.integrity.channel import GUARD_PLUGIN, GUEST_DIR, LIB_MOUNT  # noqa: E402
from sandbox.parsers.pytest import pytest_addopts, report_cases  # noqa: E402


def run_suite(base: Path, image: str, pytest_args: list[str], guard_dir: Path | None, work: Path,
              timeout: int) -> dict:
    """One run of the project's suite on a fresh copy of `base`: each test's status, and the plugin's records."""
    if work.exists():
        shutil.rmtree(work)
    tree, out = work / "tree", work / "out"
    out.mkdir(parents=True)
    subprocess.run(["cp", "-a", f"{base}/.", str(tree)], check=True)
    (out / "records.jsonl").touch()
    os.chmod(out, 0o777)
    os.chmod(out / "records.jsonl", 0o666)
    env = {"PYTEST_ADDOPTS": pytest_addopts("/out", plugin=GUARD_PLUGIN if guard_dir else None)}
    path = ["/testbed/src"] if (base / "src").is_dir() else []
    mounts = ["-v", f"{tree}:/testbed", "-v", f"{out}:/out"]
    if guard_dir is not None:
        path.insert(0, LIB_MOUNT)
        env["GAGAR_RESULT_PIPE"] = "/out/records.jsonl"
        mounts += ["-v", f"{guard_dir}:{LIB_MOUNT}:ro"]
    if path:
        env["PYTHONPATH"] = ":".join(path)
    cmd = ["docker", "run", "--rm", "--network", "none", *mounts, "-w", "/testbed",
           *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], image, "python", "-m", "pytest", "-q",
           *pytest_args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    cases = report_cases(out) or []
    records = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines() if ln.strip()]
    return {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "statuses": {tid: st for tid, st in cases}, "records": records, "tail": proc.stdout[-600:]}


def summarise(run: dict) -> dict:
    recs = run["records"]
    return {"exit": run["exit"], "tests": len(run["statuses"]), "outcomes": dict(Counter(run["statuses"].values())),
            "tamper": [r.get("what") for r in recs if r.get("e") == "tamper"],
            "xfail_from": dict(Counter(str(r.get("xh")) for r in recs if r.get("e") == "test" and "xh" in r)),
            "conftests": sorted({r.get("path") for r in recs if r.get("e") == "conftest"}),
            "wall_s": run["wall_s"]}


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--project", action="append", required=True, metavar="OWNER/NAME=IMAGE[,PYTEST_ARG...]")
    p.add_argument("--mirrors", type=Path, required=True, help="holds <owner>+<name>/repo, a clone of each project")
    p.add_argument("--guard", action="append", default=[], metavar="LABEL=DIR",
                   help="another plugin version to run too (e.g. before=<main's sandbox/integrity/guest>)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "guard_honest.json")
    p.add_argument("--update", action="store_true", help="keep the other projects already in --out")
    args = p.parse_args()
    guards = {"this": GUEST_DIR} | {g.split("=", 1)[0]: Path(g.split("=", 1)[1]).resolve() for g in args.guard}
    results = json.loads(args.out.read_text())["projects"] if args.update and args.out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="gagar-guard-honest-") as tmp:
        os.chmod(tmp, 0o755)
        for spec in args.project:
            repo, _, rest = spec.partition("=")
            image, *pytest_args = rest.split(",")
            clone = args.mirrors / repo.replace("/", "+") / "repo"
            base = Path(tmp) / repo.replace("/", "+")
            sha = gitsafe.export_commit(clone, gitsafe.resolve_commit(clone, "HEAD"), base)
            plain = run_suite(base, image, pytest_args, None, Path(tmp) / "run", args.timeout)
            entry = {"commit": sha, "image": image, "pytest_args": pytest_args, "without_guard": summarise(plain)}
            for label, gdir in guards.items():
                run = run_suite(base, image, pytest_args, gdir, Path(tmp) / "run", args.timeout)
                changed = sorted(t for t in plain["statuses"].keys() | run["statuses"].keys()
                                 if plain["statuses"].get(t) != run["statuses"].get(t))
                s = summarise(run) | {"status_changed": changed[:50], "n_status_changed": len(changed)}
                # A suite that did not run (no tests, or only a collection error) proves nothing.
                s["pass"] = (not changed and not s["tamper"] and s["exit"] == plain["exit"]
                             and plain["exit"] in (0, 1) and bool(plain["statuses"]))
                entry[label] = s
                print(f"{repo:28} {label:8} tests {s['tests']:5} {s['outcomes']} changed {len(changed)} "
                      f"tamper {len(s['tamper'])} xfail {s['xfail_from']} conftests {len(s['conftests'])} "
                      f"{'ok' if s['pass'] else 'FLAGGED' if plain['statuses'] else 'did not run'}")
            results[repo] = entry
    ok = all(v.get("pass") for e in results.values() for v in e.values() if isinstance(v, dict) and "pass" in v)
    doc = {"data": "held-out: real projects' own suites, not used to develop the guard", "projects": results,
           "all_pass": ok, "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written: {args.out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
