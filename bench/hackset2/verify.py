"""Re-run every candidate of the second hack set through the sandbox (`gagar eval`'s evaluation path) and check
that the set is still what it claims: every hack and every honest fix passes every FAIL_TO_PASS and PASS_TO_PASS
test, without tampering, and (with --golds) each group's gold fix resolves while its base does not.

With --witnesses it also checks that each hack really is one: every hack carries a `witness`, a short Python
script that asserts the behaviour the bug fix is about on inputs the tests do not use. All witnesses of a group
run in the sandbox against the gold fix and every candidate, each in a fresh interpreter outside pytest (no
PYTEST_* variables, no test frames or files on the stack, argv[0] = '-c'), from a generated test file added to the
test patch: the gold fix and every honest fix must pass all of them, and each hack must fail its own.

    .venv/bin/python bench/hackset2/verify.py --repos-dir D [--golds] [--witnesses] \
        [--out V.json]

D holds a clone of each repository named in tasks.json at <owner>__<name> (bench/hackset2/README.md says how).
Exit 0 when every check holds, 1 when one does not (each is listed), 2 on unusable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.inputs import InputError, load_instances  # noqa: E402
from sandbox.jsonl import atomic_write_text  # noqa: E402
from sandbox.records import EvalResult, Instance, Prediction  # noqa: E402
from sandbox.run import evaluate_predictions  # noqa: E402

HERE = Path(__file__).resolve().parent
KINDS = ("hack", "honest")
# A patch that changes nothing the tests see: the base (unfixed) code.
NOOP = "diff --git a/.base b/.base\nnew file mode 100644\n--- /dev/null\n+++ b/.base\n@@ -0,0 +1 @@\n+x\n"


WITNESS_FILE = "test_gagar_witness.py"
WITNESS_TEST = """import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(code):
    # a fresh interpreter outside pytest: nothing of the test run is visible to the code under check
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True,
                           timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("the witness did not finish in 20 s")
    assert r.returncode == 0, r.stderr[-3000:]
"""


@dataclass(frozen=True)
class Candidate:
    instance_id: str
    name: str
    kind: str  # "hack" | "honest"
    mindset: str
    patch: str
    witness: str = ""  # hacks: a script the gold fix passes and this hack fails


def load_candidates(path: Path, instances: dict[str, Instance]) -> list[Candidate]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read candidates file {path}: {exc}") from exc
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON list of candidates")
    out, seen, bad = [], set(), []
    for i, r in enumerate(rows):
        fields = {k: r.get(k) for k in ("instance_id", "name", "kind", "mindset", "patch")} if isinstance(r, dict) else {}
        if not fields or not all(isinstance(v, str) and v for v in fields.values()):
            bad.append(f"item {i}: needs non-empty strings instance_id, name, kind, mindset, patch")
        elif fields["kind"] not in KINDS:
            bad.append(f"item {i}: kind {fields['kind']!r} is not one of {', '.join(KINDS)}")
        elif fields["instance_id"] not in instances:
            bad.append(f"item {i}: instance {fields['instance_id']} is not in the tasks file")
        elif (fields["instance_id"], fields["name"]) in seen or fields["name"] in ("gold", "base"):
            bad.append(f"item {i}: name {fields['name']!r} is taken in {fields['instance_id']}")
        elif fields["kind"] == "hack" and not (isinstance(r.get("witness"), str) and r["witness"].strip()):
            bad.append(f"item {i}: hack {fields['name']!r} has no witness")
        elif not fields["name"].isidentifier():
            bad.append(f"item {i}: name {fields['name']!r} must be a Python identifier")
        else:
            seen.add((fields["instance_id"], fields["name"]))
            out.append(Candidate(**fields, witness=r.get("witness") or ""))
    if bad:
        raise InputError(f"{path}: " + "; ".join(bad))
    return out


def witness_instance(inst: Instance, cands: list[Candidate]) -> Instance:
    """`inst` with a generated test file holding one test per hack witness of its group; its FAIL_TO_PASS lists
    them, so the sandbox reports each witness's outcome for every candidate."""
    body = WITNESS_TEST + "".join(f"\n\ndef test_witness_{c.name}():\n    _run({c.witness!r})\n"
                                  for c in cands if c.witness)
    lines = body.splitlines()
    diff = (f"diff --git a/{WITNESS_FILE} b/{WITNESS_FILE}\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/{WITNESS_FILE}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    test_patch = inst.test_patch if inst.test_patch.endswith("\n") else inst.test_patch + "\n"
    return replace(inst, instance_id=f"{inst.instance_id}.witness", test_patch=test_patch + diff,
                   test_cmd=f"python3 -m pytest -rA -p no:cacheprovider -o addopts= {WITNESS_FILE}",  # ini addopts (--cov…) may need plugins
                   FAIL_TO_PASS=[f"{WITNESS_FILE}::test_witness_{c.name}" for c in cands if c.witness],
                   PASS_TO_PASS=[])


def witness_problems(result: EvalResult, kind: str, name: str) -> list[str]:
    """Gold and honest fixes pass every witness of their group; a hack fails its own."""
    f2p = result.tests_status.FAIL_TO_PASS
    if result.status not in ("resolved", "unresolved"):
        return [f"witness run: {result.status}" + (f" ({result.error})" if result.error else "")]
    if kind == "hack":
        own = f"{WITNESS_FILE}::test_witness_{name}"
        return [] if own in f2p["failure"] else ["passes its own witness: not shown to be a hack"]
    return [f"fails witnesses {', '.join(f2p['failure'])}"] if f2p["failure"] else []


def problems(result: EvalResult, inst: Instance, expect_pass: bool) -> list[str]:
    """What is wrong with one result; empty when it is what the set says it is."""
    f2p, p2p = result.tests_status.FAIL_TO_PASS, result.tests_status.PASS_TO_PASS
    if not expect_pass:
        return [] if not result.resolved and result.status == "unresolved" else [f"base: {result.status}"]
    out = []
    if result.status != "resolved" or not result.resolved:
        out.append(f"status {result.status}" + (f" ({result.error})" if result.error else ""))
    if result.hacked:
        out.append("the sandbox flagged tampering or a forged report")
    failed = f2p["failure"] + p2p["failure"]
    if failed:
        out.append(f"{len(failed)} failing: {', '.join(failed[:5])}")
    missing = set(inst.FAIL_TO_PASS + inst.PASS_TO_PASS) - set(f2p["success"] + p2p["success"] + failed)
    if missing:
        out.append(f"{len(missing)} not run: {', '.join(sorted(missing)[:5])}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repos-dir", required=True, help="clones at <owner>__<name>")
    ap.add_argument("--tasks", default=str(HERE / "tasks.json"))
    ap.add_argument("--candidates", default=str(HERE / "candidates.json"))
    ap.add_argument("--only", nargs="*", default=None, help="instance ids (default: all)")
    ap.add_argument("--golds", action="store_true", help="also run each group's gold fix and its base")
    ap.add_argument("--witnesses", action="store_true",
                    help="also run the hacks' witnesses against the gold fix and every candidate")
    ap.add_argument("--run-dir", default="/tmp/gagar-hackset2-verify")
    ap.add_argument("--max-workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default=None, help="write the per-candidate verdicts here (JSON)")
    args = ap.parse_args()
    notes: list[str] = []
    try:
        instances = load_instances(Path(args.tasks), notes)
        cands = load_candidates(Path(args.candidates), instances)
        if args.only:
            unknown = sorted(set(args.only) - set(instances))
            if unknown:
                raise InputError(f"--only names instances not in {args.tasks}: {', '.join(unknown)}")
            instances = {k: v for k, v in instances.items() if k in args.only}
            cands = [c for c in cands if c.instance_id in instances]
        missing = sorted({i.repo_dirname for i in instances.values()
                          if not (Path(args.repos_dir) / i.repo_dirname).is_dir()})
        if missing:
            raise InputError(f"--repos-dir {args.repos_dir} lacks the clones {', '.join(missing)}")
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"note: {n}", file=sys.stderr)

    preds = [Prediction(instance_id=c.instance_id, model_patch=c.patch, model_name_or_path=c.kind,
                        rollout_id=c.name) for c in cands]
    if args.golds:
        preds += [Prediction(instance_id=i.instance_id, model_patch=p, model_name_or_path=r, rollout_id=r)
                  for i in instances.values() for r, p in (("gold", i.patch), ("base", NOOP))]
    if args.witnesses:
        winst = {}
        for inst in instances.values():
            group = [c for c in cands if c.instance_id == inst.instance_id]
            if any(c.witness for c in group):
                w = witness_instance(inst, group)
                winst[w.instance_id] = w
                preds += [Prediction(instance_id=w.instance_id, model_patch=c.patch, model_name_or_path=c.kind,
                                     rollout_id=c.name) for c in group]
                preds.append(Prediction(instance_id=w.instance_id, model_patch=inst.patch,
                                        model_name_or_path="gold", rollout_id="gold"))
        instances = {**instances, **winst}
    cfg = SandboxConfig(repos_dir=args.repos_dir, image="gagar-python:latest", max_workers=args.max_workers,
                        timeout=args.timeout, run_id="hackset2-verify")
    t0 = time.monotonic()
    results = evaluate_predictions(instances, preds, cfg, run_dir=Path(args.run_dir), redo=True)
    wall = time.monotonic() - t0

    kind_of = {(c.instance_id, c.name): c.kind for c in cands}
    verdicts, tally = [], Counter()
    for r in results:
        base_id, is_witness = r.instance_id.removesuffix(".witness"), r.instance_id.endswith(".witness")
        kind = kind_of.get((base_id, r.rollout_id), r.rollout_id)  # gold/base rows carry their role as rollout_id
        if is_witness:
            why = witness_problems(r, kind, r.rollout_id)
            kind = f"{kind} (witnesses)"
        else:
            why = problems(r, instances[r.instance_id], expect_pass=kind != "base")
        tally[(kind, not why)] += 1
        verdicts.append({"instance_id": r.instance_id, "name": r.rollout_id, "kind": kind, "ok": not why,
                         "status": r.status, "problems": why, "duration_s": round(r.duration_s, 2)})
        if why:
            print(f"FAIL {r.instance_id} {r.rollout_id} ({kind}): {'; '.join(why)}")
    kinds = sorted({k for k, _ in tally})
    summary = {k: {"ok": tally[(k, True)], "failed": tally[(k, False)]} for k in kinds}
    for k in kinds:
        print(f"{k:19s} {summary[k]['ok']:3d} ok, {summary[k]['failed']} failed")
    print(f"{len(results)} sandbox runs in {wall:.0f} s wall ({sum(r.duration_s for r in results):.0f} s in "
          f"containers, {args.max_workers} workers)")
    if args.out:
        atomic_write_text(args.out, json.dumps({"summary": summary, "wall_s": round(wall, 1),
                                                "verdicts": verdicts}, indent=1) + "\n")
    return 0 if all(v["ok"] for v in verdicts) and len(results) == len(preds) else 1


if __name__ == "__main__":
    sys.exit(main())
