"""The learned judge on groups from repositories it never saw: the table of `make judge`.

    python bench/judge.py --data .gagar/judge/data --base smollm2-135m-instruct \
                          --adapter .gagar/models/judge

The held-out groups (`val_groups.jsonl` of `gagar sft data --split repo`: every instance of a held-out repository,
none of which any training record came from) are ranked by four rankers, answer grammar off (a model's answer is
its own free text; an unusable one gets one retry, then the group falls back and scores 0 here):

- the heuristic (`grader.heuristic`, diff features and sizes);
- the untuned base model, zero-shot, on the same prompt;
- the tuned judge (base + LoRA adapter);
- the tuned judge with the static findings removed from its prompt: only the code to go by.

Columns: usable free answers (valid answer replies / all answer replies), top-1, pairwise accuracy (mean per
group), pairwise accuracy on the size-inverted pairs (the better patch changes more lines than the worse one:
a complete fix against an incomplete one or a special case; pooled over pairs), and gold above hack (groups
with both: the gold patch ranked above the special case). These are the rankers' own orders: the static hack
verdicts that `gagar grade` applies afterwards (`grader.hacks.detect`) are reported apart, as the "product" figures,
with a check that `gagar grade --judge llm --model BASE --adapter ADAPTER` returns the same rankings.
Wall and CPU times and the load average are recorded beside every row (a shared machine).
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
from grader.heuristic import rank_features, workspace_features  # noqa: E402
from grader.judge.llm import LLMJudge  # noqa: E402
from grader.metrics import evaluate  # noqa: E402
from grader.records import Grading, load_groups, read_jsonl, write_jsonl_atomic  # noqa: E402
from grader.workspace import SharedWorkspace  # noqa: E402
from sandbox.jsonl import atomic_write_text  # noqa: E402
from trainer.experiments.verdicts import diff_size  # noqa: E402

COLUMNS = ("usable free answers", "top-1", "pairwise", "pairwise on size-inverted pairs", "gold above hack")


def _cpu() -> float:
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


def rank_all(groups: list, repos: Path, judge: LLMJudge | None, batch: int) -> tuple[list[Grading], list[Grading]]:
    """(the ranker's own gradings, the same after the static hack verdicts), batch by batch of workspaces."""
    own: list[Grading] = []
    product: list[Grading] = []
    for i in range(0, len(groups), batch):
        with ExitStack() as stack:
            wss = [stack.enter_context(SharedWorkspace(g, repos)) for g in groups[i:i + batch]]
            if judge is None:
                got = [rank_features(ws.group.instance_id, workspace_features(ws), ws.failed) for ws in wss]
            else:
                got = judge.grade_workspaces(wss)
            own += got
            product += [apply_hacks(g, workspace_hacks(ws)) for g, ws in zip(got, wss, strict=True)]
        print(f"  {min(i + batch, len(groups))}/{len(groups)} groups", flush=True)
    return own, product


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
    own_only = evaluate(answered, {k: v for k, v in gold.items() if k in answered}) if answered else None
    return {
        "groups": len(gold), "answered": len(answered), "fallback_rate": round(1 - len(answered) / max(1, len(gold)), 4),
        "top1": round(m["top1"], 4), "pairwise": round(m["pairwise_accuracy"], 4),
        "kendall_tau": round(m["kendall_tau"], 4),
        "size_inverted_pairs": inv_n, "size_inverted_pairwise": round(inv_ok / max(1, inv_n), 4),
        "gold_hack_groups": hack_n, "gold_above_hack": round(hack_ok / max(1, hack_n), 4),
        "answered_only": {k: round(v, 4) if isinstance(v, float) else v for k, v in own_only.items()}
        if own_only else None,
    }


def run_row(name: str, groups: list, repos: Path, gold: dict, inverted: dict, judge: LLMJudge | None,
            batch: int) -> tuple[dict[str, Any], list[Grading]]:
    print(f"{name}:", flush=True)
    t, c, load = time.perf_counter(), _cpu(), os.getloadavg()
    own, product = rank_all(groups, repos, judge, batch)
    row: dict[str, Any] = {"ranker": name, **score(own, gold, inverted)}
    if judge is not None:
        st = judge.stats
        replies = st["replies"]
        row.update(answer_replies=replies, usable_free_answers=round((replies - st["unusable_replies"]) / max(1, replies), 4),
                   tool_calls=st["tool_calls"])
    row["product"] = score(product, gold, inverted)  # after the static hack verdicts, as `gagar grade` returns
    row.update(wall_s=round(time.perf_counter() - t, 1), cpu_s=round(_cpu() - c, 1),
               load_avg_1m=[round(load[0], 2), round(os.getloadavg()[0], 2)])
    print(f"  {json.dumps({k: v for k, v in row.items() if k not in ('product', 'answered_only')})}", flush=True)
    return row, product


def cli_check(groups_file: Path, repos: Path, base: str, adapter: str, out: Path, k: int, max_new_tokens: int,
              expected: list[Grading]) -> dict[str, Any]:
    """`gagar grade --judge llm --model BASE --adapter ADAPTER` on the first k groups: the same rankings?"""
    sub = out.with_name("cli_groups.jsonl")
    write_jsonl_atomic(sub, read_jsonl(groups_file)[:k])
    cmd = [sys.executable, "-m", "gagar", "grade", "--groups", str(sub), "--repos-dir", str(repos), "--out", str(out),
           "--judge", "llm", "--model", base, "--adapter", adapter, "--answer-grammar", "off",
           "--max-new-tokens", str(max_new_tokens), "--redo", "--no-progress"]
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
        usable = f"{r['usable_free_answers']:.3f}" if "usable_free_answers" in r else "—"
        lines.append(f"| {r['ranker']} ({r['groups']} groups) | {usable} | {r['top1']:.3f} | {r['pairwise']:.3f} | "
                     f"{r['size_inverted_pairwise']:.3f} ({r['size_inverted_pairs']} pairs) | "
                     f"{r['gold_above_hack']:.3f} ({r['gold_hack_groups']} groups) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / ".gagar/judge/data")
    p.add_argument("--repos-dir", type=Path, help="default: the data's repos dir (its manifest names it)")
    p.add_argument("--base", default="smollm2-135m-instruct", help="base model: registry name, path or hub id")
    p.add_argument("--adapter", default=str(ROOT / ".gagar/models/judge"))
    p.add_argument("--run-dir", type=Path, default=ROOT / ".gagar/judge/run", help="`gagar sft train` output")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/judge.json")
    p.add_argument("--max-new-tokens", type=int, default=320, help="an answer takes 60-250 tokens")
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--every", type=int, default=1, help="every N-th held-out group (2: one per instance when "
                   "the data has two groups per instance)")
    p.add_argument("--max-groups", type=int, help="only the first N (after --every) held-out groups")
    p.add_argument("--base-groups", type=int, help="the untuned base on only the first N of them (it rarely "
                   "answers, and its long unusable replies are what costs)")
    p.add_argument("--cli-groups", type=int, default=8, help="groups graded again through `gagar grade` (0: none)")
    p.add_argument("--skip-base", action="store_true", help="leave out the untuned base row")
    args = p.parse_args(argv)
    from inference.backends import make_backend

    manifest = json.loads((args.data / "manifest.json").read_text())
    repos = args.repos_dir or Path(manifest.get("repos_dir") or ROOT / ".gagar/judge/repos")
    groups = load_groups(args.data / "val_groups.jsonl")[:: max(1, args.every)][: args.max_groups or None]
    labels = {str(r["instance_id"]): [str(x) for x in r["order"]] for r in read_jsonl(args.data / "val_labels.jsonl")}
    gold = {g.instance_id: labels[g.instance_id] for g in groups}
    inverted = inverted_pairs(groups, gold)
    kinds = Counter(r for order in gold.values() for r in order)
    report: dict[str, Any] = {
        "held_out_repos": manifest["repos"]["val"], "train_repos": manifest["repos"]["train"],
        "held_out_instances": len(manifest["instances"]["val"]), "train_instances": len(manifest["instances"]["train"]),
        "train_records": manifest["records"]["train"], "groups": len(groups),
        "candidates": dict(sorted(kinds.items())), "answer_grammar": "off", "cpus": os.cpu_count(),
        "torch_threads": __import__("torch").get_num_threads(),
    }
    summary = args.run_dir / "sft_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        report["training"] = {k: s.get(k) for k in ("base_model", "global_step", "train_loss", "train_seconds",
                                                     "cpu_seconds", "torch_threads", "load_average", "records",
                                                     "dropped_too_long", "stopped_at_time_cap")}
    rows = []
    row, _ = run_row("heuristic", groups, repos, gold, inverted, None, args.batch_groups)
    rows.append(row)

    def judge(backend: Any, findings: bool = True) -> LLMJudge:
        return LLMJudge(backend, answer_grammar=False, max_new_tokens=args.max_new_tokens, max_turns=4,
                        findings=findings)

    if not args.skip_base:
        base = make_backend("transformers", args.base)
        sub = groups[: args.base_groups or None]
        row, _ = run_row("untuned base (zero-shot)", sub, repos, {g.instance_id: gold[g.instance_id] for g in sub},
                         inverted, judge(base), args.batch_groups)
        rows.append(row)
        del base
    tuned = make_backend("transformers", args.base, adapter=args.adapter)
    row, product = run_row("tuned judge", groups, repos, gold, inverted, judge(tuned), args.batch_groups)
    rows.append(row)
    row, _ = run_row("tuned judge, no static findings", groups, repos, gold, inverted, judge(tuned, findings=False),
                     args.batch_groups)
    rows.append(row)
    report["rows"] = rows
    report["table"] = table(rows)
    if args.cli_groups:
        graded = args.run_dir / "heldout_groups.jsonl"
        write_jsonl_atomic(graded, [g.to_dict() for g in groups])
        report["cli_check"] = cli_check(graded, repos, args.base, args.adapter, args.run_dir / "cli_gradings.jsonl",
                                        min(args.cli_groups, len(groups)), args.max_new_tokens, product)
    atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    print(report["table"])
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
