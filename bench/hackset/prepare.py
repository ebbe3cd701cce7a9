"""Build the real-fix groups of the fresh hack set: for each commit of a local clone, the base (its parent), the
gold fix (its library diff), the test patch (its test diff), and FAIL_TO_PASS / PASS_TO_PASS measured by running
the unfixed code and the gold fix through the sandbox (`gagar eval`'s evaluation path).

    .venv/bin/python bench/hackset/prepare.py --repos-dir D --repo owner/name --commits C... --out tasks.json

`tasks.json` (the fresh set's 10 groups) keeps PASS_TO_PASS: its hacks are evaluated against it. `golds.json`
(37 more fixes, only probed alone) was written by the same command and then stripped of PASS_TO_PASS (the probe
runs the failing tests only; `PASS_TO_PASS_count` says how many there were) to keep the repository small.
`--append` merges into an existing `--out`, so a set drawn from several repositories (bench/hackset2) is built by
one call per repository.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grader.features import is_test_path  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.integrity.gitsafe import source_git  # noqa: E402
from sandbox.jsonl import atomic_write_text  # noqa: E402
from sandbox.parsers import parse_results  # noqa: E402
from sandbox.records import Instance, Prediction  # noqa: E402
from sandbox.run import evaluate_predictions  # noqa: E402


def task_of(repo_dir: Path, repo: str, commit: str) -> dict:
    sha = source_git(repo_dir, "rev-parse", commit).strip()
    files = source_git(repo_dir, "diff", "--no-ext-diff", "--name-only", f"{sha}^", sha).split()
    lib = [f for f in files if f.endswith(".py") and not is_test_path(f)]
    tests = [f for f in files if is_test_path(f) and f.endswith(".py")]
    return {"instance_id": f"{repo.replace('/', '__')}-{commit[:7]}", "repo": repo,
            "base_commit": source_git(repo_dir, "rev-parse", f"{sha}^").strip(), "fix_commit": sha,
            "patch": source_git(repo_dir, "diff", "--no-ext-diff", f"{sha}^", sha, "--", *lib),
            "test_patch": source_git(repo_dir, "diff", "--no-ext-diff", f"{sha}^", sha, "--", *tests),
            "test_cmd": "python3 -m pytest -rA " + " ".join(tests), "test_framework": "pytest",
            "problem_statement": source_git(repo_dir, "log", "-1", "--format=%B", sha).strip()}


def statuses(run_dir: Path, iid: str, rid: str) -> dict[str, str]:
    d = run_dir / "logs" / iid / rid
    out = (d / "test_output.txt").read_text(errors="replace") if (d / "test_output.txt").exists() else ""
    return parse_results("pytest", out, d / "report").statuses


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--repos-dir", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commits", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-dir", default="/tmp/gagar-hackset-prepare")
    ap.add_argument("--append", action="store_true",
                    help="merge into an existing --out (one call per repository), replacing same instance_ids")
    args = ap.parse_args()
    repo_dir = Path(args.repos_dir) / args.repo.replace("/", "__")
    tasks = [task_of(repo_dir, args.repo, c) for c in args.commits]
    insts = {t["instance_id"]: Instance.from_dict({**t, "FAIL_TO_PASS": [], "PASS_TO_PASS": []}) for t in tasks}
    preds = [Prediction(instance_id=t["instance_id"], model_patch=p, model_name_or_path="prepare", rollout_id=r)
             for t in tasks for r, p in (("gold", t["patch"]), ("base", "diff --git a/.base b/.base\nnew file mode "
                                          "100644\n--- /dev/null\n+++ b/.base\n@@ -0,0 +1 @@\n+x\n"))]
    cfg = SandboxConfig(repos_dir=args.repos_dir, image="gagar-python:latest", max_workers=2, timeout=300)
    run_dir = Path(args.run_dir)
    evaluate_predictions(insts, preds, cfg, run_dir=run_dir, redo=True, require_fail_to_pass=False)  # derives them
    out = []
    for t in tasks:
        gold, base = statuses(run_dir, t["instance_id"], "gold"), statuses(run_dir, t["instance_id"], "base")
        f2p = sorted(k for k, s in gold.items() if s == "PASSED" and base.get(k) != "PASSED")
        p2p = sorted(k for k, s in gold.items() if s == "PASSED" and base.get(k) == "PASSED")
        print(t["instance_id"], "F2P", f2p, "P2P", len(p2p))
        if f2p:
            out.append({**t, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    if args.append and Path(args.out).exists():
        new = {t["instance_id"] for t in out}
        out = [t for t in json.loads(Path(args.out).read_text()) if t["instance_id"] not in new] + out
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
