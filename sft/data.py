"""`gagar sft data`: judge training data with known-order labels.

Two sources:
- synthetic (default): every instance's gold patch plus cumulatively degraded variants (`sft.degrade`), whose
  quality order is known by construction; `--groups-per-instance K` makes K groups per instance with different
  defects and letter shuffles.
- real rollouts (`--from-results`): the passing patches of a `gagar eval` run, grouped by instance and ranked by
  the heuristic (`--labeller heuristic`) or a teacher model on an OpenAI-compatible server (`--labeller teacher`).

OUT gets `train.jsonl` / `val.jsonl` (chat records: `messages` + scoring metadata), `groups.jsonl` and
`labels.jsonl` for every group, `val_groups.jsonl` / `val_labels.jsonl` for `gagar sft eval` and
`gagar grade eval`, and `manifest.json`. The split is by source instance: no instance is in both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from grader.records import Candidate, Group, InputError, write_jsonl_atomic
from sandbox.records import Instance
from sft.augment import renamed_record
from sft.degrade import KINDS, DegradeError, Variant, degrade_on, scratch_tree
from sft.inverted import inverted_on
from sft.records import RecordError, build_records, tiers_from_defects
from sft.rollouts import rollout_groups


def project(repo: str) -> str:
    """The project a repository holds, whatever its owner: `pytoolz/toolz`, a task factory's `pypi/toolz` and
    `astanin/python-tabulate` / `tabulate` are one project each, so a split never puts one on both sides."""
    name = repo.rsplit("/", 1)[-1].lower().replace("_", "-")
    return re.sub(r"^(python|py)-(?=.)", "", name)


def split_repos(sources: dict[str, str], val_fraction: float, seed: int,
                explicit: dict[str, str] | None = None) -> tuple[set[str], set[str]]:
    """Train/validation sets of source instances, split by project (`sources`: instance -> owner/name; `project`):
    no project has instances on both sides. `explicit` (instance -> train|heldout, e.g. from `gagar sft history`)
    holds a project out when any of its instances says `heldout`; the other projects are split by
    `val_fraction`."""
    explicit = explicit or {}
    held = {project(sources[i]) for i in sources if explicit.get(i) == "heldout"}
    fixed = held | {project(sources[i]) for i in sources if i in explicit}
    free = sorted({project(r) for r in sources.values()} - fixed)
    _, val_free = split_instances(free, val_fraction, seed) if free else (set(), set())
    val = {i for i, r in sources.items() if project(r) in held | val_free}
    return set(sources) - val, val


def split_instances(ids: list[str], val_fraction: float, seed: int) -> tuple[set[str], set[str]]:
    """Train/validation sets of source instances; validation gets at least one when there are two or more."""
    ids = sorted(set(ids))
    random.Random(seed).shuffle(ids)
    n_val = round(len(ids) * val_fraction)
    if val_fraction > 0 and len(ids) >= 2:
        n_val = min(max(1, n_val), len(ids) - 1)
    return set(ids[n_val:]), set(ids[:n_val])


def _verify_id(k: int, v: Variant) -> str:
    # The patch hash keeps a resumed sandbox run from reusing a verdict for a different patch under the same id
    # (a rerun with other --seed or --kinds builds other variants).
    return f"{k}:{v.rollout_id}:{hashlib.sha1(v.patch.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"


def _verify(
    instances: dict[str, Any],
    groups: list[tuple[str, list[Variant]]],
    repos_dir: Path,
    run_dir: Path | None,
    timeout: float,
) -> tuple[list[tuple[str, list[Variant]]], list[str]]:
    """Run every variant through the sandbox; keep only passing ones (the gold must pass too)."""
    from sandbox.config import SandboxConfig
    from sandbox.records import Prediction
    from sandbox.run import evaluate_predictions

    preds = [
        Prediction(
            instance_id=iid,
            model_patch=v.patch,
            model_name_or_path="sft-degrade",
            rollout_id=_verify_id(k, v),
        )
        for k, (iid, variants) in enumerate(groups)
        for v in variants
    ]
    config = SandboxConfig(repos_dir=repos_dir, timeout=timeout, run_id="sft-verify")
    results = evaluate_predictions(instances, preds, config, run_dir=run_dir, progress=True)
    ok = {(r.instance_id, r.rollout_id) for r in results if r.passed}
    kept, notes = [], []
    for k, (iid, variants) in enumerate(groups):
        if (iid, _verify_id(k, variants[0])) not in ok:
            notes.append(f"{iid}: the gold patch does not pass in the sandbox; group dropped")
            continue
        good = [v for v in variants if (iid, _verify_id(k, v)) in ok]
        for v in variants:
            if v not in good:
                notes.append(
                    f"{iid}: variant {v.rollout_id} ({', '.join(a.kind for a in v.applied)}) fails; dropped"
                )
        if len(good) >= 2:
            kept.append((iid, good))
    return kept, notes


def synthetic_groups(
    instances: dict[str, Any],
    repos_dir: Path,
    *,
    variants: int,
    groups_per_instance: int,
    seed: int,
    kinds: list[str],
    verify: bool,
    verify_dir: Path | None,
    timeout: float,
    subsets: bool = False,
    inverted: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Group specs: {group, source, order, tiers, evidence, kinds} per (instance, k[, subset]); with `inverted`,
    each group mixes in the instance's partial fix and special case (`mixed`)."""
    notes: list[str] = []
    built: list[tuple[str, list[Variant]]] = []
    for iid, inst in instances.items():
        d = inst.to_dict() if hasattr(inst, "to_dict") else dict(inst)
        try:
            with scratch_tree(d, repos_dir) as tree:
                sets = [degrade_on(tree, iid, n_variants=variants, seed=seed * 1000 + k, kinds=kinds)
                        for k in range(groups_per_instance)]
                extra = inverted_on(tree, iid, str(d.get("test_patch") or ""), seed=seed,
                                    fail_to_pass=list(d.get("FAIL_TO_PASS") or [])) if inverted else {}
        except DegradeError as exc:
            notes.append(str(exc))
            continue
        if len(sets[0]) < 2 and not extra:
            notes.append(f"{iid}: no degradation fits this instance; skipped")
            continue
        rng = random.Random(f"{iid}:mix:{seed}")
        for vs in sets:
            group = mixed(vs, extra, rng) if inverted else vs
            if len(group) >= 2:
                built.append((iid, group))
    if verify:
        built, vnotes = _verify(instances, built, repos_dir, verify_dir, timeout)
        notes += vnotes
    specs = []
    count: dict[str, int] = defaultdict(int)
    for iid, all_vs in built:
        inst = instances[iid] if isinstance(instances[iid], Instance) else Instance.from_dict(instances[iid])
        for vs in _subsets(all_vs) if subsets else [all_vs]:
            k = count[iid]
            count[iid] += 1
            group = dataclasses.replace(Group.of_instance(inst, [Candidate(v.rollout_id, v.patch) for v in vs]),
                                        instance_id=f"{iid}#{k}")
            order = [v.rollout_id for v in vs]
            specs.append(
                {
                    "group": group,
                    "source": iid,
                    "order": order,
                    "tiers": tiers_from_defects(order, {v.rollout_id: 2 if v.rollout_id in RANK else len(v.applied)
                                                        for v in vs}),
                    # at most the two latest defects: what sets a variant below the one before it, in fewer tokens
                    "evidence": {v.rollout_id: list(v.evidence)[-2:] for v in vs},
                    "kinds": {v.rollout_id: [a.kind for a in v.applied] or ([v.rollout_id] if v.rollout_id in RANK
                                                                               else []) for v in vs},
                }
            )
    return specs, notes


# The known order of a mixed group: complete fixes (the gold patch, then its degraded copies, worse with every defect)
# above an incomplete fix, above a special case of the tests' inputs (sft.inverted).
RANK = {"partial": 100, "hack": 101}


def mixed(complete: list[Variant], extra: dict[str, Variant], rng: random.Random) -> list[Variant]:
    """A group of 2-4 of the gold patch, its degraded copies and the instance's smaller, worse patches (a partial
    fix, a special case), in quality order. A partial fix only comes with a complete fix beside it: alone, nothing
    in the group shows what it leaves out."""
    others = [extra[k] for k in ("partial", "hack") if k in extra]
    size = min(len(complete) + len(others), rng.choice((2, 3, 3, 4)))
    n_extra = min(len(others), size - 1, rng.choice((0, 1, 1, 2)) if others else 0)
    picked = rng.sample(others, n_extra)
    picked += rng.sample(complete, min(len(complete), size - n_extra))
    if len(picked) < 2:
        return complete
    return sorted(picked, key=lambda v: RANK.get(v.rollout_id, complete.index(v) if v in complete else 99))


def _subsets(variants: list[Variant]) -> list[list[Variant]]:
    """The whole set, then every sub-set of two or more in quality order: more groups of known order
    (a judge must also rank a group whose best candidate is not the gold patch)."""
    n = len(variants)
    out = [variants]
    for size in range(n - 1, 1, -1):
        out += [[variants[i] for i in idx] for idx in combinations(range(n), size)]
    return out


def write_dataset(
    specs: list[dict[str, Any]],
    repos_dir: Path,
    out: Path,
    *,
    val_fraction: float,
    seed: int,
    notes: list[str],
    meta: dict[str, Any],
    shuffles: int = 1,
    inspect: bool = True,
    cite: str = "given",
    renames: int = 0,
    split_by: str = "instance",
    explicit_split: dict[str, str] | None = None,
    no_findings: float = 0.0,
) -> dict[str, Any]:
    """Records (train: `shuffles` letter shuffles per group, each with `renames` renamed copies, see
    `sft.augment`, a `no_findings` share of them without the static findings; val: one, never renamed, with
    findings) and the group/label files, split by instance or (`split_by="repo"`) by repository."""
    if split_by == "repo":
        train_ids, val_ids = split_repos({s["source"]: s["group"].repo for s in specs}, val_fraction, seed,
                                         explicit_split)
    else:
        train_ids, val_ids = split_instances([s["source"] for s in specs], val_fraction, seed)
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    groups: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    labels: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for s in specs:
        split = "val" if s["source"] in val_ids else "train"
        k = shuffles if split == "train" else 1
        frng = random.Random(f"{seed}:findings:{s['group'].instance_id}")
        shown = [split == "val" or frng.random() >= no_findings for _ in range(k)]
        try:
            recs = build_records(s["group"], repos_dir, s["order"], s["tiers"], s["evidence"],
                                 seeds=[seed * 1000 + j for j in range(k)], inspect=inspect, cite=cite,
                                 findings=shown)
        except RecordError as exc:
            notes.append(str(exc))
            continue
        for rec in recs:
            rec.update(source_instance_id=s["source"], split=split, defects=s["kinds"])
        if split == "train" and renames:
            rng = random.Random(f"{seed}:{s['group'].instance_id}")
            recs += [renamed_record(rec, rng) for rec in list(recs) for _ in range(renames)]
        rows[split].extend(recs)
        groups[split].append(s["group"].to_dict())
        labels[split].append(
            # the records' tiers: with --cite findings they are what the prompt shows (sft.records)
            {"instance_id": s["group"].instance_id, "order": s["order"], "tiers": recs[0]["tiers"]}
        )
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        write_jsonl_atomic(out / f"{split}.jsonl", rows[split])
    write_jsonl_atomic(out / "val_groups.jsonl", groups["val"])
    write_jsonl_atomic(out / "val_labels.jsonl", labels["val"])
    write_jsonl_atomic(out / "groups.jsonl", groups["train"] + groups["val"])
    write_jsonl_atomic(out / "labels.jsonl", labels["train"] + labels["val"])
    repo_of = {s["source"]: s["group"].repo for s in specs}
    manifest = {
        **meta,
        "split_by": split_by,
        "records": {k: len(v) for k, v in rows.items()},
        "records_without_findings": sum(not r.get("findings", True) for r in rows["train"]),
        "repos": {"train": sorted({repo_of[i] for i in train_ids}), "val": sorted({repo_of[i] for i in val_ids})},
        "instances": {"train": sorted(train_ids), "val": sorted(val_ids)},
        "candidates_per_group": sorted({len(s["order"]) for s in specs}),
        "notes": notes,
    }
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / "manifest.json")
    return manifest


def load_sources(pairs: list[tuple[Path, Path]], out: Path, notes: list[str]
                 ) -> tuple[dict[str, Instance], dict[str, str], Path]:
    """Instances of every (instances file, repos dir) pair, their explicit splits (a `split` field, as `gagar sft
    history` writes), and one repos dir for all of them: the only one given, or OUT/repos with a link per
    repository (so the groups files downstream name one --repos-dir)."""
    from sandbox.inputs import load_instances
    from sandbox.jsonl import read_jsonl

    instances: dict[str, Instance] = {}
    explicit: dict[str, str] = {}
    where: dict[str, Path] = {}
    for path, repos in pairs:
        if not repos.is_dir():
            raise InputError(f"--repos-dir {repos} is not a directory")
        got = load_instances(path, notes)
        for r in read_jsonl(path):
            if isinstance(r, dict) and r.get("split") in ("train", "heldout") and str(r.get("instance_id")) in got:
                explicit[str(r["instance_id"])] = r["split"]
        for iid, inst in got.items():
            if iid in instances:
                notes.append(f"{path}: instance {iid} was given before; the first is used")
                continue
            instances[iid] = inst
            other = where.setdefault(inst.repo_dirname, repos)
            if other != repos:
                raise InputError(f"{inst.repo} is in both {other} and {repos}: give each repository once")
    if len(pairs) == 1:
        return instances, explicit, pairs[0][1]
    from sft.history import link_repos

    for name, repos in where.items():
        link_repos(repos, [name], out / "repos")
    return instances, explicit, out / "repos"


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar sft data", description=__doc__.splitlines()[0])
    p.add_argument("--instances", required=True, type=Path, action="append",
                   help="SWE-bench-format instances (JSONL) with gold patch; repeat for more sources")
    p.add_argument("--repos-dir", required=True, type=Path, action="append",
                   help="directory holding <owner>__<name> git repos; one per --instances, in the same order")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--variants", type=int, default=3, help="degraded variants per group (besides the gold)")
    p.add_argument("--groups-per-instance", type=int, default=2, help="groups built from each instance")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated degradations to use")
    p.add_argument("--val-fraction", type=float, default=0.25, help="share of instances (or repos) held out")
    p.add_argument("--split", choices=("instance", "repo"), default="instance",
                   help="hold out whole instances, or whole repositories (an instance's `split` field decides "
                        "where given: `heldout` or `train`)")
    p.add_argument("--inverted", action="store_true",
                   help="mix in each instance's smaller, worse patches: a partial fix and a special case (Python)")
    p.add_argument("--no-findings", type=float, default=0.0, metavar="SHARE",
                   help="share of the train records whose prompt shows no static findings (the judge must read code)")
    p.add_argument("--shuffles", type=int, default=1, help="train records per group, each a new letter shuffle")
    p.add_argument("--rename", type=int, default=0,
                   help="renamed copies of each train record (fresh file/repo names: the judge must copy, not recall)")
    p.add_argument("--subsets", action="store_true", help="also every sub-group of 2+ candidates of each set")
    p.add_argument("--inspect", choices=("diffs", "none"), default="diffs",
                   help="expert turns before the answer: show_diff of every candidate, or none (answer from the summary)")
    p.add_argument("--cite", choices=("given", "findings"), default="given",
                   help="evidence: the known defects, or the static findings the prompt shows (citable by a small model)")
    p.add_argument("--seed", type=int, default=0, help="degradations, shuffles and the split")
    p.add_argument("--max-instances", type=int, help="use only the first N instances")
    p.add_argument(
        "--verify", action="store_true", help="run every variant in the sandbox; drop failing ones"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="sandbox timeout per variant (--verify)")
    p.add_argument(
        "--from-results", type=Path, help="`gagar eval` results.jsonl: label real rollouts instead"
    )
    p.add_argument("--predictions", type=Path, help="the predictions evaluated in --from-results (patches)")
    p.add_argument("--labeller", choices=("heuristic", "teacher"), default="heuristic",
                   help="--from-results: who orders the real rollouts (teacher: a model over --base-url)")
    p.add_argument("--base-url", help="teacher: OpenAI-compatible server URL")
    p.add_argument("--model", help="teacher: model name on that server")
    args = p.parse_args(argv)
    prog = "gagar sft data"
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        print(f"{prog}: unknown --kinds {', '.join(bad)}; choose from {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if (args.variants < 1 or args.groups_per_instance < 1 or args.shuffles < 1 or not 0 <= args.val_fraction < 1
            or args.rename < 0 or not 0 <= args.no_findings <= 1):
        print(
            f"{prog}: --variants, --groups-per-instance and --shuffles must be >= 1, --rename >= 0, "
            "--val-fraction in [0, 1), --no-findings in [0, 1]",
            file=sys.stderr,
        )
        return 2
    if len(args.repos_dir) != len(args.instances):
        print(f"{prog}: give one --repos-dir per --instances ({len(args.instances)} instances files, "
              f"{len(args.repos_dir)} repos dirs)", file=sys.stderr)
        return 2
    if args.from_results and (not args.predictions or len(args.instances) > 1):
        print(
            f"{prog}: --from-results needs --predictions (the results file has no patches) and one --instances",
            file=sys.stderr,
        )
        return 2

    notes: list[str] = []
    try:
        instances, explicit, repos_dir = load_sources(list(zip(args.instances, args.repos_dir, strict=True)),
                                                      args.out, notes)
        if args.max_instances:
            instances = dict(list(instances.items())[: args.max_instances])
        if not instances:
            raise InputError(f"{', '.join(map(str, args.instances))}: no usable instances")
        if args.from_results:
            specs, more = rollout_groups(
                instances,
                args.from_results,
                args.predictions,
                repos_dir,
                labeller=args.labeller,
                base_url=args.base_url,
                model=args.model,
            )
            meta = {"source": "rollouts", "labeller": args.labeller, "results": str(args.from_results)}
        else:
            # Inside OUT so that a rerun resumes the sandbox run instead of evaluating every variant again.
            verify_dir = args.out / "verify" if args.verify else None
            specs, more = synthetic_groups(
                instances,
                repos_dir,
                variants=args.variants,
                groups_per_instance=args.groups_per_instance,
                seed=args.seed,
                kinds=kinds,
                verify=args.verify,
                verify_dir=verify_dir,
                timeout=args.timeout,
                subsets=args.subsets,
                inverted=args.inverted,
            )
            meta = {"source": "synthetic", "kinds": kinds, "variants": args.variants, "verified": args.verify,
                    "inverted": args.inverted}
    except (InputError, OSError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    notes += more
    if not specs:
        print(f"{prog}: no groups could be built:\n  " + "\n  ".join(notes[:20]), file=sys.stderr)
        return 2
    m = write_dataset(
        specs,
        repos_dir,
        args.out,
        val_fraction=args.val_fraction,
        seed=args.seed,
        notes=notes,
        meta={**meta, "shuffles": args.shuffles, "subsets": args.subsets, "inspect": args.inspect, "cite": args.cite,
              "renames": args.rename, "repos_dir": str(repos_dir), "no_findings": args.no_findings},
        shuffles=args.shuffles,
        renames=args.rename,
        inspect=args.inspect == "diffs",
        cite=args.cite,
        split_by=args.split,
        explicit_split=explicit,
        no_findings=args.no_findings,
    )
    print(
        f"{prog}: {m['records']['train']} train / {m['records']['val']} val records "
        f"({len(m['instances']['train'])} / {len(m['instances']['val'])} instances, "
        f"{len(m['repos']['train'])} / {len(m['repos']['val'])} repositories) -> {args.out}"
    )
    for n in notes[:10]:
        print(f"  note: {n}")
    return 0
