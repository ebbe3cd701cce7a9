"""The learned judge on held-out instances: quality vs the heuristic, parse/fallback rates, batched speed.

`make judge` runs this after `gagar sft data` and `gagar sft train --config configs/judge_cpu.yaml`:

    python bench/judge.py --data .gagar/judge/data --repos-dir .gagar/tasks/repos --model .gagar/models/judge

It grades the held-out groups (`val_groups.jsonl`: instances no training record came from) three ways — the
heuristic, the learned judge through `gagar grade --judge llm` (the CLI, as users run it), and the same through
the Python API with batching on and off to time it — and writes `bench/results/judge.json`. Wall times on a
shared machine are noisy: CPU seconds and the load average are recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.backends import make_backend  # noqa: E402
from grader.grade import grade_groups  # noqa: E402
from grader.judge import decoded_in_grammar  # noqa: E402
from grader.metrics import evaluate  # noqa: E402
from grader.records import load_groups, read_jsonl, write_jsonl_atomic  # noqa: E402
from sandbox.report import atomic_write_text  # noqa: E402


def _cpu() -> float:
    # Children too: the CLI pass runs as a subprocess.
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


def _timed(fn):
    t, c, load = time.perf_counter(), _cpu(), os.getloadavg()[0]
    out = fn()
    return out, {"wall_s": round(time.perf_counter() - t, 2), "cpu_s": round(_cpu() - c, 2),
                 "load_avg_1m": round(load, 2)}


def _metrics(gradings, gold) -> dict:
    m = evaluate({g.instance_id: g.ranking for g in gradings}, gold)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}


def _cli(groups: Path, repos: Path, model: str, out: Path, max_new_tokens: int,
         grammar: str = "auto") -> tuple[list[dict], str]:
    cmd = [sys.executable, "-m", "gagar", "grade", "--groups", str(groups), "--repos-dir", str(repos),
           "--out", str(out), "--judge", "llm", "--model", model, "--max-new-tokens", str(max_new_tokens),
           "--answer-grammar", grammar, "--redo", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"gagar grade failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return read_jsonl(out), proc.stdout.strip()


def _judge_report(rows: list[dict], cli_out: str, gold: dict, heur: list, timing: dict) -> dict:
    def m(sub: list[dict], ref: dict) -> dict:
        ids = {r["instance_id"] for r in sub}  # scored on the groups of `sub` only (missing ones would score 0)
        got = evaluate({r["instance_id"]: r["ranking"] for r in sub}, {k: v for k, v in ref.items() if k in ids})
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in got.items()}

    in_grammar = [r for r in rows if not r["fallback"] and decoded_in_grammar(r.get("notes", []))]
    free = [r for r in rows if not r["fallback"] and r not in in_grammar]
    # Reply-level parse rate, as the CLI reports it: free replies that were usable / all free replies.
    m_parse = re.search(r"judge replies: (\d+), usable (\d+)", cli_out)
    replies, usable = (int(m_parse.group(1)), int(m_parse.group(2))) if m_parse else (0, 0)
    n = max(1, len(rows))
    return {
        **m(rows, gold),
        "fallback_rate": round(sum(bool(r["fallback"]) for r in rows) / n, 4),
        "answer_rate": round(sum(not r["fallback"] for r in rows) / n, 4),  # groups ranked by the model itself
        "replies": replies,
        "parse_rate": round(usable / max(1, replies), 4),  # free-form replies only
        "grammar_answer_share": round(len(in_grammar) / n, 4),
        "free_answers_only": m(free, gold) if free else None,
        "grammar_answers_only": m(in_grammar, gold) if in_grammar else None,
        # Agreement with the heuristic on the same groups (how far the learned judge is its own ranker).
        "vs_heuristic": m(rows, {g.instance_id: g.ranking for g in heur}),
        "cli_summary": cli_out,
        **timing,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / ".gagar/judge/data")
    p.add_argument("--repos-dir", type=Path, default=ROOT / ".gagar/tasks/repos")
    p.add_argument("--model", default=str(ROOT / ".gagar/models/judge"))
    p.add_argument("--run-dir", type=Path, default=ROOT / ".gagar/judge/run", help="`gagar sft train` output")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/judge.json")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--every", type=int, default=2,
                   help="grade every N-th held-out group (a spread over instances and subset sizes; 1 = all)")
    p.add_argument("--speed-groups", type=int, default=16, help="groups timed batched vs one at a time")
    args = p.parse_args(argv)

    all_groups = load_groups(args.data / "val_groups.jsonl")
    groups = all_groups[:: max(1, args.every)]
    gold = {str(r["instance_id"]): [str(x) for x in r["order"]] for r in read_jsonl(args.data / "val_labels.jsonl")}
    gold = {g.instance_id: gold[g.instance_id] for g in groups}
    graded_file = args.run_dir / "heldout_groups.jsonl"
    graded_file.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(graded_file, [g.to_dict() for g in groups])
    manifest = json.loads((args.data / "manifest.json").read_text())
    report: dict = {
        "held_out_instances": manifest["instances"]["val"],
        "train_instances": manifest["instances"]["train"],
        "groups": len(groups),
        "held_out_groups_total": len(all_groups),
        "every": args.every,
        "train_records": manifest["records"]["train"],
        "cpus": os.cpu_count(),
    }
    summary = args.run_dir / "sft_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        report["training"] = {k: s.get(k) for k in ("global_step", "train_loss", "train_seconds", "cpu_seconds",
                                                     "torch_threads", "load_average", "full_weights", "records")}
        report["training"]["final_eval"] = (s.get("eval") or [{}])[-1]

    heur, t_h = _timed(lambda: grade_groups(groups, args.repos_dir, judge="heuristic"))
    report["heuristic"] = {**_metrics(heur, gold), **t_h}

    # The learned judge as users run it: the CLI, batched (its default), on every held-out group; then the same
    # with free replies only (no answer grammar: an unusable reply gets one retry, then the heuristic fallback).
    for key, grammar in (("judge_cli", "auto"), ("judge_cli_free", "off")):
        (rows, out), t_cli = _timed(lambda g=grammar: _cli(graded_file, args.repos_dir, args.model,
                                                           args.run_dir / f"heldout_gradings_{g}.jsonl",
                                                           args.max_new_tokens, g))
        report[key] = _judge_report(rows, out, gold, heur, t_cli)
    backend = make_backend("transformers", args.model)
    sub = groups[: args.speed_groups]
    speed = {}
    for name, batch in (("batched", 8), ("one_at_a_time", 1)):
        _, t = _timed(lambda b=batch: grade_groups(sub, args.repos_dir, judge="llm", backend=backend,
                                                   max_new_tokens=args.max_new_tokens, batch_groups=b))
        speed[name] = {**t, "groups": len(sub), "groups_per_s_wall": round(len(sub) / t["wall_s"], 3),
                       "groups_per_cpu_s": round(len(sub) / max(t["cpu_s"], 1e-9), 3)}
    _, t = _timed(lambda: grade_groups(sub, args.repos_dir, judge="llm", backend=backend, permutations=3,
                                       max_new_tokens=args.max_new_tokens, batch_groups=8))
    speed["batched_3_permutations"] = {**t, "groups": len(sub), "groups_per_s_wall": round(len(sub) / t["wall_s"], 3),
                                       "groups_per_cpu_s": round(len(sub) / max(t["cpu_s"], 1e-9), 3)}
    speed["torch_threads"] = __import__("torch").get_num_threads()
    report["speed"] = speed
    atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    h = report["heuristic"]
    for key in ("judge_cli", "judge_cli_free"):
        j = report[key]
        print(f"{key} ({len(groups)} held-out groups): top-1 {j['top1']:.3f} pairwise {j['pairwise_accuracy']:.3f} "
              f"tau {j['kendall_tau']:.3f} free parse {j['parse_rate']:.3f} grammar {j['grammar_answer_share']:.3f} "
              f"fallback {j['fallback_rate']:.3f}")
    print(f"heuristic: top-1 {h['top1']:.3f} pairwise {h['pairwise_accuracy']:.3f} tau {h['kendall_tau']:.3f} "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
