"""The learned judge on groups from repositories it never saw: the table of `make judge`.

    python bench/judge.py --data .gagar/judge/data --adapter .gagar/models/judge --every 3

The held-out groups (`val_groups.jsonl` of `gagar sft data --split repo`: every instance of a held-out repository,
none of which gave a training record or a calibration group) are ranked by:

- the heuristic (`grader.heuristic`, diff features and sizes);
- the generative judge as measured before (the row of an earlier `make judge` run, copied from `--previous`
  when it ranked the same selection of the same held-out instances; it is not rerun: see docs/sft.md);
- the scoring judge (`grader.judge.scoring`, base + LoRA adapter: each pair in both orders, P("A") averaged);
- the combined judge: the scorer's verdict where |P − ½| ≥ the confidence `gagar sft calibrate` chose on the
  calibration groups (training projects), the heuristic's order elsewhere.

The scorer and the combined judge rank from the same model scores (computed once). Columns: usable (groups the
judge ranked itself, not by fallback), top-1, pairwise accuracy (mean per group), pairwise accuracy on the
size-inverted pairs (the better patch changes more lines: a complete fix against a partial fix or a special case;
pooled over pairs), gold above hack (groups with both). These are each ranker's own order; `product` in the JSON
is the same after the static hack verdicts that `gagar grade` applies. `pairs` breaks the accuracy down by the
kinds of the two candidates (which inputs the scorer gets wrong). Cost: groups/s and prompts/s of the scorer
(2 torch threads), with the load average; `--vllm` repeats the scorer on the vLLM backend. Finally the first
groups are graded again through `gagar grade --judge combined` to check the CLI returns the same rankings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.hacks.detect import apply_hacks, workspace_hacks  # noqa: E402
from grader.heuristic import rank_workspace  # noqa: E402
from grader.judge.scoring import ScoringJudge, Verdicts, read_calibration  # noqa: E402
from grader.metrics import evaluate  # noqa: E402
from grader.records import Grading, load_groups, read_jsonl, write_jsonl_atomic  # noqa: E402
from grader.workspace import SharedWorkspace  # noqa: E402
from sandbox.jsonl import atomic_write_text  # noqa: E402
from sandbox.patchcheck import diff_size  # noqa: E402

COLUMNS = ("usable", "top-1", "pairwise", "size-inverted pairwise", "gold above hack")
GENERATIVE = "generative judge (as measured before)"


def _cpu() -> float:
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


def inverted_pairs(groups: list, gold: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    """Per group, the (better, worse) pairs of its known order where the better patch changes more lines."""
    out = {}
    for g in groups:
        size = {c.rollout_id: diff_size(c.patch)[0] for c in g.candidates}
        out[g.instance_id] = [(a, b) for a, b in combinations(gold[g.instance_id], 2) if size[a] > size[b]]
    return out


def score(gradings: list[Grading], gold: dict[str, list[str]], inverted: dict[str, list[tuple[str, str]]]
          ) -> dict[str, Any]:
    """The table's figures; a group that fell back to the heuristic counts as wrong (the ranker gave no answer)."""
    answered = {g.instance_id: g.ranking for g in gradings if not g.fallback}
    m = evaluate(answered, gold)
    inv_ok = inv_n = hack_ok = hack_n = 0
    for iid, order in gold.items():
        pos = {r: i for i, r in enumerate(answered.get(iid, []))}
        for a, b in inverted[iid]:
            inv_n += 1
            inv_ok += a in pos and b in pos and pos[a] < pos[b]
        if "gold" in order and "hack" in order:
            hack_n += 1
            hack_ok += "gold" in pos and "hack" in pos and pos["gold"] < pos["hack"]
    return {
        "groups": len(gold), "answered": len(answered), "usable": round(len(answered) / max(1, len(gold)), 4),
        "fallback_rate": round(1 - len(answered) / max(1, len(gold)), 4),
        "top1": round(m["top1"], 4), "pairwise": round(m["pairwise_accuracy"], 4),
        "kendall_tau": round(m["kendall_tau"], 4),
        "size_inverted_pairs": inv_n, "size_inverted_pairwise": round(inv_ok / max(1, inv_n), 4),
        "gold_hack_groups": hack_n, "gold_above_hack": round(hack_ok / max(1, hack_n), 4),
        "gold_above_hack_count": hack_ok,
    }


def _kind(rid: str) -> str:
    return rid.split("#", 1)[0]


def pair_breakdown(verdicts: list[Verdicts], gold: dict[str, list[str]], confidence: float) -> list[dict[str, Any]]:
    """Accuracy per kind of pair (`gold>partial`, `d1>hack`, ...): the heuristic's order, the scorer's verdict
    (P > ½), the combined rule's; and the scorer's mean P(better ≻ worse)."""
    acc: dict[str, Counter[str]] = {}
    for v in verdicts:
        order = gold[v.heuristic.instance_id]
        h = v.heuristic.ranking
        for better, worse in combinations([r for r in order if r in v.staged], 2):
            c = acc.setdefault(f"{_kind(better)}>{_kind(worse)}", Counter())
            p = v.p(better, worse)
            c["n"] += 1
            c["heuristic"] += h.index(better) < h.index(worse)
            if p is None:
                continue
            c["scored"] += 1
            c["scorer"] += p > 0.5
            c["p_sum_x1000"] += round(p * 1000)
            confident = abs(p - 0.5) >= confidence - 1e-9
            c["combined"] += (p > 0.5) if confident else (h.index(better) < h.index(worse))
    rows = []
    for kind, c in sorted(acc.items(), key=lambda kv: -kv[1]["n"]):
        n, s = c["n"], max(1, c["scored"])
        rows.append({"pair": kind, "pairs": n, "heuristic": round(c["heuristic"] / n, 3),
                     "scorer": round(c["scorer"] / s, 3), "combined": round(c["combined"] / n, 3),
                     "mean_p_better": round(c["p_sum_x1000"] / 1000 / s, 3)})
    return rows


def heuristic_row(groups: list, repos: Path, gold: dict, inverted: dict) -> dict[str, Any]:
    t, c, load = time.perf_counter(), _cpu(), os.getloadavg()
    own = []
    for g in groups:
        with SharedWorkspace(g, repos) as ws:
            own.append(rank_workspace(ws))
    row = {"ranker": "heuristic", **score(own, gold, inverted), "product": score(own, gold, inverted)}
    row.update(wall_s=round(time.perf_counter() - t, 1), cpu_s=round(_cpu() - c, 1),
               load_avg_1m=[round(load[0], 2), round(os.getloadavg()[0], 2)])
    return row


def model_rows(groups: list, repos: Path, gold: dict, inverted: dict, backend: Any, confidence: float, batch: int,
               label: str) -> tuple[list[dict[str, Any]], list[Verdicts], dict[str, list[Grading]]]:
    """The scorer's and the combined judge's rows from one pass of model scores, with the pass's cost."""
    scorer = ScoringJudge(backend)
    combined = ScoringJudge(backend, combine="confident", confidence=confidence)
    own: dict[str, list[Grading]] = {"score": [], "combined": []}
    product: dict[str, list[Grading]] = {"score": [], "combined": []}
    verdicts: list[Verdicts] = []
    t, c, load = time.perf_counter(), _cpu(), os.getloadavg()
    model_s = 0.0
    for i in range(0, len(groups), batch):
        with ExitStack() as stack:
            wss = [stack.enter_context(SharedWorkspace(g, repos)) for g in groups[i:i + batch]]
            t0 = time.perf_counter()
            vs = scorer.verdicts(wss)
            model_s += time.perf_counter() - t0
            verdicts += vs
            for name, judge in (("score", scorer), ("combined", combined)):
                got = [judge.grading(ws, v) for ws, v in zip(wss, vs, strict=True)]
                own[name] += got
                product[name] += [apply_hacks(g, workspace_hacks(ws)) for g, ws in zip(got, wss, strict=True)]
        print(f"  {label}: {min(i + batch, len(groups))}/{len(groups)} groups", flush=True)
    wall = time.perf_counter() - t
    cost = {"backend": label, "groups": len(groups), "prompts": scorer.stats.get("prompts", 0),
            "wall_s": round(wall, 1), "model_s": round(model_s, 1), "cpu_s": round(_cpu() - c, 1),
            "groups_per_s": round(len(groups) / wall, 3),
            "prompts_per_s": round(scorer.stats.get("prompts", 0) / max(1e-9, model_s), 2),
            "load_avg_1m": [round(load[0], 2), round(os.getloadavg()[0], 2)]}
    rows = []
    for name, title in (("score", "scoring judge"), ("combined", f"combined (confidence {confidence:g})")):
        rows.append({"ranker": title, "backend": label, **score(own[name], gold, inverted),
                     "product": score(product[name], gold, inverted)})
    return rows, verdicts, {"cost": [cost], **product}


def previous_generative(path: Path, selection: dict[str, Any]) -> dict[str, Any] | None:
    """The generative judge's row of an earlier run, if it ranked the same selection of held-out groups."""
    if not path.is_file():
        return None
    old = json.loads(path.read_text(encoding="utf-8"))
    row = next((r for r in old.get("rows", []) if r.get("ranker") in ("tuned judge", GENERATIVE)), None)
    if row is None or old.get("groups") != selection["groups"] or old.get("candidates") != selection["candidates"] \
            or sorted(old.get("held_out_repos", [])) != sorted(selection["held_out_repos"]):
        return None
    keep = ("groups", "top1", "pairwise", "kendall_tau", "size_inverted_pairs", "size_inverted_pairwise",
            "gold_hack_groups", "gold_above_hack", "wall_s", "cpu_s")
    out = {"ranker": GENERATIVE, **{k: row[k] for k in keep if k in row}}
    out["usable"] = row.get("usable", row.get("usable_free_answers"))
    out["gold_above_hack_count"] = round(row.get("gold_above_hack", 0) * row.get("gold_hack_groups", 0))
    out["source"] = row.get("source") or old.get("note", "")[:300]
    return out


def earlier_generative(path: Path) -> dict[str, Any] | None:
    """The generative judge's row of an earlier run whatever groups it ranked (kept apart from the table's rows
    when this run ranks another selection, e.g. a subset of the same held-out groups)."""
    if not path.is_file():
        return None
    old = json.loads(path.read_text(encoding="utf-8"))
    return previous_generative(path, {k: old.get(k) for k in ("groups", "candidates", "held_out_repos")})


def cli_check(groups_file: Path, repos: Path, base: str, adapter: str, out: Path, k: int, confidence: float,
              expected: list[Grading]) -> dict[str, Any]:
    """`gagar grade --judge combined --model BASE --adapter ADAPTER` on the first k groups: the same rankings?"""
    sub = out.with_name("cli_groups.jsonl")
    write_jsonl_atomic(sub, read_jsonl(groups_file)[:k])
    cmd = [sys.executable, "-m", "gagar", "grade", "--groups", str(sub), "--repos-dir", str(repos), "--out", str(out),
           "--judge", "combined", "--model", base, "--adapter", adapter, "--confidence", str(confidence),
           "--redo", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        return {"groups": k, "error": proc.stderr[-1000:]}
    got = {r["instance_id"]: r["ranking"] for r in read_jsonl(out)}
    want = {g.instance_id: g.ranking for g in expected[:k]}
    return {"groups": k, "same_ranking": sum(got.get(i) == r for i, r in want.items()), "summary": proc.stdout.strip()}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| ranker | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        usable = "—" if r["ranker"] == "heuristic" else f"{r['usable']:.2f}" if r.get("usable") is not None else "?"
        lines.append(f"| {r['ranker']} ({r['groups']} groups) | {usable} | {r['top1']:.3f} | {r['pairwise']:.3f} | "
                     f"{r['size_inverted_pairwise']:.3f} ({r['size_inverted_pairs']} pairs) | "
                     f"{r.get('gold_above_hack_count', 0)}/{r['gold_hack_groups']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / ".gagar/judge/data")
    p.add_argument("--repos-dir", type=Path, help="default: the data's repos dir (its manifest names it)")
    p.add_argument("--base", default="smollm2-135m-instruct", help="base model: registry name, path or hub id")
    p.add_argument("--adapter", default=str(ROOT / ".gagar/models/judge"))
    p.add_argument("--run-dir", type=Path, default=ROOT / ".gagar/judge/run", help="`gagar sft train` output")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/judge.json")
    p.add_argument("--previous", type=Path, help="an earlier judge.json holding the generative judge's row "
                   "(default: --out before it is rewritten)")
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--every", type=int, default=1, help="every N-th held-out group")
    p.add_argument("--max-groups", type=int, help="only the first N (after --every) held-out groups")
    p.add_argument("--cli-groups", type=int, default=4, help="groups graded again through `gagar grade` (0: none)")
    p.add_argument("--vllm", action="store_true", help="also score with the vLLM backend (cost and rankings)")
    p.add_argument("--vllm-groups", type=int, help="with --vllm: only the first N groups (the cost and agreement on "
                   "fewer groups when time is short)")
    p.add_argument("--note", default="", help="what else the machine was doing (recorded as is)")
    args = p.parse_args(argv)
    from inference.backends import make_backend

    manifest = json.loads((args.data / "manifest.json").read_text())
    repos = args.repos_dir or Path(manifest.get("repos_dir") or ROOT / ".gagar/judge/repos")
    groups = load_groups(args.data / "val_groups.jsonl")[:: max(1, args.every)][: args.max_groups or None]
    labels = {str(r["instance_id"]): [str(x) for x in r["order"]] for r in read_jsonl(args.data / "val_labels.jsonl")}
    gold = {g.instance_id: labels[g.instance_id] for g in groups}
    inverted = inverted_pairs(groups, gold)
    cal = read_calibration(args.adapter)
    if cal is None:
        print(f"bench/judge.py: no calibration beside {args.adapter}: run `gagar sft calibrate` first", file=sys.stderr)
        return 2
    confidence = float(cal["confidence"])
    report: dict[str, Any] = {
        "note": args.note, "held_out_repos": manifest["repos"]["val"], "train_repos": manifest["repos"]["train"],
        "calibration_repos": manifest["repos"].get("calib", []),
        "held_out_instances": len(manifest["instances"]["val"]), "train_instances": len(manifest["instances"]["train"]),
        "train_records": manifest["records"]["train"], "groups": len(groups),
        "candidates": dict(sorted(Counter(r for order in gold.values() for r in order).items())),
        "cpus": os.cpu_count(), "torch_threads": __import__("torch").get_num_threads(),
        "calibration": {k: cal[k] for k in ("confidence", "chosen", "groups", "repos", "scorer", "heuristic")
                        if k in cal},
    }
    generative = previous_generative(args.previous or args.out, report)
    if generative is None:
        report["generative_other_groups"] = earlier_generative(args.previous or args.out)
    summary = args.run_dir / "sft_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        report["training"] = {k: s.get(k) for k in ("objective", "base_model", "global_step", "train_loss",
                                                     "train_seconds", "cpu_seconds", "torch_threads", "load_average",
                                                     "records", "size_balance", "dropped_too_long",
                                                     "planned_steps", "steps_fitted_to_budget", "stopped_at_time_cap")}
    print("heuristic:", flush=True)
    rows = [heuristic_row(groups, repos, gold, inverted)]
    if generative:
        rows.append(generative)
    tuned = make_backend("transformers", args.base, adapter=args.adapter)
    got, verdicts, out = model_rows(groups, repos, gold, inverted, tuned, confidence, args.batch_groups,
                                    "transformers")
    rows += got
    report["cost"] = out["cost"]
    report["pairs"] = pair_breakdown(verdicts, gold, confidence)
    if args.vllm:
        del tuned
        # the engine is seeded, the requests are not; float32 as the transformers backend; a 1 GiB KV cache (vLLM on
        # a CPU would otherwise reserve most of the RAM); LoRA slots for the adapter's rank
        vllm = make_backend("vllm", args.base, adapter=args.adapter, seed=0, dtype="float32",
                            kv_cache_gib=1.0, max_lora_rank=16)
        some = groups[: args.vllm_groups or None]
        some_gold = {g.instance_id: gold[g.instance_id] for g in some}
        vrows, _, vout = model_rows(some, repos, some_gold, inverted, vllm, confidence, args.batch_groups, "vllm")
        report["cost"] += vout["cost"]
        report["vllm_rows"] = vrows
        report["vllm_same_ranking"] = {
            "groups": len(some),
            "same": sum(a.ranking == b.ranking for a, b in zip(out["combined"], vout["combined"], strict=False))}
    report["rows"] = rows
    report["table"] = table(rows)
    if args.cli_groups:
        graded = args.run_dir / "heldout_groups.jsonl"
        write_jsonl_atomic(graded, [g.to_dict() for g in groups])
        report["cli_check"] = cli_check(graded, repos, args.base, args.adapter, args.run_dir / "cli_gradings.jsonl",
                                        min(args.cli_groups, len(groups)), confidence, out["combined"])
    atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    print(report["table"])
    print(json.dumps(report["cost"]))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
