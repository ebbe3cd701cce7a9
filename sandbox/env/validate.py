"""`gagar validate`: check a task set before anyone trains on it.

For each instance the sandbox runs the base (a no-op patch, so the tests really run at `base_commit` with the
task's test_patch) and the gold patch, `--repeats` times each, in the instance's image (env images built on
demand, as in `gagar eval`). An instance is valid when, in every repeat, every FAIL_TO_PASS test fails without
the fix and passes with it and every PASS_TO_PASS test passes with it. A test whose outcome differs between
repeats of the same patch is flaky: listed, and with `--drop-flaky` removed from the instance's lists before
it is judged. Writes `OUT/validated.jsonl` (the valid instance records, as given), `OUT/validate_report.json`
and the evaluation run itself under `OUT/runs/<run id>/`.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from sandbox.records import EvalResult, Instance, Prediction

NOOP_FILE = ".gagar-validate-base"
# A patch that changes nothing the tests can see: `gagar eval` gives an empty patch `empty_patch` without
# running anything, and validation needs the base's real test results.
NOOP_PATCH = (f"diff --git a/{NOOP_FILE} b/{NOOP_FILE}\nnew file mode 100644\n--- /dev/null\n+++ b/{NOOP_FILE}\n"
              "@@ -0,0 +1 @@\n+gagar validate: the base commit, unchanged\n")


def validation_predictions(instances: list[Instance], repeats: int) -> list[Prediction]:
    preds = []
    for inst in instances:
        for k in range(1, repeats + 1):
            preds.append(Prediction(inst.instance_id, NOOP_PATCH, "gagar-validate", f"base-{k}"))
            if inst.patch.strip():
                preds.append(Prediction(inst.instance_id, inst.patch, "gagar-validate", f"gold-{k}"))
    return preds


def _outcomes(results: list[EvalResult]) -> dict[str, list[bool]]:
    """test id → pass/fail per run (only runs whose tests ran)."""
    out: dict[str, list[bool]] = defaultdict(list)
    for r in results:
        for group in (r.tests_status.FAIL_TO_PASS, r.tests_status.PASS_TO_PASS):
            for t in group.get("success", []):
                out[t].append(True)
            for t in group.get("failure", []):
                out[t].append(False)
    return out


def judge(inst: Instance, results: list[EvalResult], drop_flaky: bool) -> dict[str, Any]:
    """The verdict for one instance from its base-* and gold-* results (see the module docstring)."""
    base = [r for r in results if r.rollout_id.startswith("base-")]
    gold = [r for r in results if r.rollout_id.startswith("gold-")]
    ran = ("resolved", "unresolved")
    errors = sorted({f"{r.rollout_id}: {r.status}: {r.error}" for r in results if r.status not in ran})
    ob, og = _outcomes([r for r in base if r.status in ran]), _outcomes([r for r in gold if r.status in ran])
    tests = [*inst.FAIL_TO_PASS, *inst.PASS_TO_PASS]
    flaky = sorted(t for t in tests if len(set(ob.get(t, []))) > 1 or len(set(og.get(t, []))) > 1)
    f2p = [t for t in inst.FAIL_TO_PASS if not (drop_flaky and t in flaky)]
    p2p = [t for t in inst.PASS_TO_PASS if not (drop_flaky and t in flaky)]
    rep: dict[str, Any] = {
        "valid": False, "flaky": flaky, "errors": errors,
        "f2p_pass_without_fix": [t for t in f2p if any(ob.get(t, []))],
        "f2p_fail_with_gold": [t for t in f2p if not og.get(t) or not all(og[t])],
        "p2p_fail_with_gold": [t for t in p2p if not og.get(t) or not all(og[t])],
        "runs": {"base": [r.status for r in base], "gold": [r.status for r in gold]},
    }
    reasons = []
    if not inst.patch.strip():
        reasons.append("no gold patch")
    if errors:
        reasons.append("runs did not complete: " + "; ".join(errors[:3]))
    if not f2p:
        reasons.append("no FAIL_TO_PASS test left" + (" after dropping flaky ones" if drop_flaky else ""))
    for key, what in (("f2p_pass_without_fix", "FAIL_TO_PASS tests pass without the fix"),
                      ("f2p_fail_with_gold", "FAIL_TO_PASS tests fail with the gold patch"),
                      ("p2p_fail_with_gold", "PASS_TO_PASS tests fail with the gold patch")):
        if rep[key]:
            reasons.append(f"{what}: {', '.join(rep[key][:5])}" + (" …" if len(rep[key]) > 5 else ""))
    if flaky and not drop_flaky:
        reasons.append(f"flaky tests (outcome changes between repeats): {', '.join(flaky[:5])}")
    rep["valid"] = not reasons
    rep["reasons"] = reasons
    rep["FAIL_TO_PASS"], rep["PASS_TO_PASS"] = f2p, p2p
    return rep


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", required=True, type=Path, help="instances (JSONL, JSON list, or dict by id)")
    p.add_argument("--repos-dir", required=True, type=Path, help="dir holding <owner>__<name> git clones")
    p.add_argument("--out", required=True, type=Path, help="where validated.jsonl and the report go")
    p.add_argument("--env-specs", help="JSON {repo: {version: spec}} for instances without env, or `swebench`")
    p.add_argument("--repeats", type=int, default=3, help="runs of the base and of the gold patch (default 3)")
    p.add_argument("--drop-flaky", action="store_true", help="remove flaky tests from the lists, then judge")
    p.add_argument("--max-workers", type=int, default=1, help="containers run at once (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per test run")
    p.add_argument("--image", help="run every instance in this image")
    p.add_argument("--run-id", default="validate", help="name of the evaluation run under OUT/runs/")
    p.add_argument("--redo", action="store_true", help="re-run instead of reusing OUT/runs/RUN_ID")
    args = p.parse_args(argv)
    prog = "gagar validate"
    if args.repeats < 1:
        return _err(prog, "--repeats must be at least 1")
    if not args.repos_dir.is_dir():
        return _err(prog, f"--repos-dir {args.repos_dir}: not a directory")
    from sandbox.config import SandboxConfig
    from sandbox.env.spec import SpecError, load_spec_file
    from sandbox.inputs import InputError, _records, load_instances, require_runnable
    from sandbox.jsonl import atomic_write_text
    from sandbox.run import evaluate_predictions, image_missing

    notes: list[str] = []
    try:
        specs = load_spec_file(args.env_specs) if args.env_specs else None
        if not args.instances.is_file():
            raise InputError(f"--instances {args.instances}: no such file")
        instances = load_instances(args.instances, notes)
        raw = {str(r.get("instance_id")): r for _, r in _records(args.instances, "instances", [])}
    except (InputError, SpecError) as exc:
        return _err(prog, str(exc))
    for n in notes:
        print(f"{prog}: warning: {n}", file=sys.stderr)
    if not instances:
        return _err(prog, f"{args.instances}: no instances")
    from sandbox.env.spec import apply_specs

    for n in apply_specs(instances, specs):
        print(f"{prog}: warning: {n}", file=sys.stderr)
    if args.image and (missing := image_missing(args.image, override=True)):
        return _err(prog, missing)
    try:
        require_runnable(instances, args.instances)  # after the specs: a spec may give the test_cmd
    except InputError as exc:
        return _err(prog, str(exc))
    try:
        config = SandboxConfig(repos_dir=args.repos_dir.resolve(), image=args.image, timeout=args.timeout,
                               max_workers=args.max_workers, run_id=args.run_id)
        args.out.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:
        return _err(prog, str(exc))
    preds = validation_predictions(list(instances.values()), args.repeats)
    results = evaluate_predictions(instances, preds, config, run_dir=args.out / "runs" / args.run_id,
                                   redo=args.redo, progress=True)
    by_inst: dict[str, list[EvalResult]] = defaultdict(list)
    for r in results:
        by_inst[r.instance_id].append(r)
    per = {iid: judge(inst, by_inst[iid], args.drop_flaky) for iid, inst in instances.items()}
    valid_rows = []
    for iid, rep in per.items():
        if rep["valid"]:
            row = dict(raw.get(iid) or instances[iid].to_dict())
            if args.drop_flaky:
                row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = rep["FAIL_TO_PASS"], rep["PASS_TO_PASS"]
            valid_rows.append(row)
    atomic_write_text(args.out / "validated.jsonl", "".join(json.dumps(r) + "\n" for r in valid_rows))
    report = {"instances": len(per), "valid": len(valid_rows), "repeats": args.repeats,
              "drop_flaky": args.drop_flaky, "flaky_instances": sorted(i for i, r in per.items() if r["flaky"]),
              "invalid_ids": sorted(i for i, r in per.items() if not r["valid"]), "per_instance": per}
    atomic_write_text(args.out / "validate_report.json", json.dumps(report, indent=2) + "\n")
    for iid, rep in per.items():
        mark = "valid" if rep["valid"] else "INVALID"
        print(f"{iid}: {mark}" + ("" if rep["valid"] else " — " + " | ".join(rep["reasons"])), file=sys.stderr)
    print(f"{len(valid_rows)}/{len(per)} valid → {args.out / 'validated.jsonl'}; report "
          f"{args.out / 'validate_report.json'}", file=sys.stderr)
    return 0


def _err(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2
