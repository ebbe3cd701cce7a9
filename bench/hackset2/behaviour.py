"""The behavioural probe's findings for every bench/hackset2 group, for `score.py --behaviour`.

    .venv/bin/python bench/hackset2/behaviour.py --repos-dir D \
        [--out behaviour.jsonl] [--split dev|heldout] [--budget-s 120]

Runs the product's probe the way the trainer does (`trainer.judging` with `grader.probe`): one
`grader.probe.runner.probe_group` call per group over all of its passing candidates together — here the gold fix,
the group's hacks and its honest fixes (every one passes the group's tests, `verify.py` checks that) — with the
probe's default budget, and writes one JSONL line `{instance_id, behaviour, probed, why_not, seconds}` per
group, `behaviour` being `{rollout_id: [finding dicts]}` as the trainer puts on a group. The candidates'
labels are never given to the probe: it sees rollout ids and patches only.

Exit 0 when written, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grader.probe.runner import DEFAULT_BUDGET_S, probe_group  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.jsonl import write_jsonl_atomic  # noqa: E402
from sandbox.records import Instance  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repos-dir", required=True, help="clones at <owner>__<name> (README.md says how)")
    ap.add_argument("--tasks", default=str(HERE / "tasks.json"))
    ap.add_argument("--candidates", default=str(HERE / "candidates.json"))
    ap.add_argument("--split", choices=("dev", "heldout"), default=None, help="only this split's groups")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the probe's budget per group")
    ap.add_argument("--workers", type=int, default=2, help="candidates run in parallel")
    ap.add_argument("--out", default="behaviour.jsonl")
    args = ap.parse_args()
    try:
        tasks = json.loads(Path(args.tasks).read_text())
        cands = json.loads(Path(args.candidates).read_text())
        missing = sorted({t["repo"] for t in tasks
                          if not (Path(args.repos_dir) / t["repo"].replace("/", "__")).is_dir()})
        if missing:
            raise ValueError(f"--repos-dir {args.repos_dir} lacks clones of {', '.join(missing)}")
        cfg = SandboxConfig(repos_dir=args.repos_dir, image="gagar-python:latest", max_workers=args.workers)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = []
    t_all = time.monotonic()
    for t in tasks:
        if args.split and t["split"] != args.split:
            continue
        iid = t["instance_id"]
        patches = {"gold": t["patch"]} | {c["name"]: c["patch"] for c in cands if c["instance_id"] == iid}
        run = probe_group(Instance.from_dict(t), patches, cfg, budget_s=args.budget_s)
        behaviour = {rid: [dataclasses.asdict(f) for f in found] for rid, found in run.findings.items() if found}
        rows.append({"instance_id": iid, "behaviour": behaviour, "probed": run.probed, "why_not": run.why_not,
                     "seconds": run.seconds})
        print(f"{iid:36s} {run.seconds:6.1f}s probed={run.probed} {run.why_not} "
              f"flagged {len(behaviour)}/{len(patches)}", flush=True)
    write_jsonl_atomic(args.out, rows)
    print(f"{len(rows)} groups in {time.monotonic() - t_all:.0f}s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
