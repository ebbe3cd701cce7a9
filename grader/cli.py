"""`gagar grade` (rank groups, resumable, atomic output) and `gagar grade eval` (metrics against known orders)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from grader.grade import grade_groups
from grader.metrics import evaluate
from grader.records import Group, InputError, load_groups, read_jsonl, write_jsonl_atomic
from inference.backends import make_backend
from inference.base import ChatBackend
from sandbox.integrity import gitsafe


def _judge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--judge", choices=["heuristic", "llm"], default="heuristic")
    p.add_argument("--model", help="judge model: local path or hub id (openai: the server's model name)")
    p.add_argument("--adapter", help="PEFT adapter directory (transformers and vllm backends)")
    p.add_argument("--backend", choices=["transformers", "openai", "vllm", "vllm-server"], default="transformers")
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--permutations", type=int, default=1, help="shuffled label orders, Borda-aggregated")
    p.add_argument("--max-turns", type=int, default=12, help="tool-call budget per judge run")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-groups", type=int, default=8,
                   help="LLM judge: groups whose conversations share each model batch (1 = one at a time)")
    p.add_argument("--answer-grammar", choices=["auto", "on", "off"], default="auto",
                   help="LLM judge: when a free reply is not a valid answer, decode the model's most likely valid "
                        "answer in the answer grammar instead of retrying and falling back (auto: where the "
                        "backend can, i.e. transformers; off: free replies only)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


def _check_repos(groups: list[Group], repos_dir: Path) -> str | None:
    """Every group's repository and base commit must exist before hours of grading start."""
    if not repos_dir.is_dir():
        return f"--repos-dir {repos_dir} is not a directory"
    problems = []
    for g in groups:
        src = repos_dir / g.repo_dirname
        if not src.is_dir():
            problems.append(f"{g.instance_id}: no repository at {src}")
            continue
        ok = gitsafe.run("cat-file", "-e", f"{g.base_commit}^{{commit}}", git_dir=gitsafe.git_dir_of(src),
                         trusted_dir=src).ok
        if not ok:
            problems.append(f"{g.instance_id}: base_commit {g.base_commit} is not in {src}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        return "; ".join(problems[:5]) + more
    return None


def _backend(args: argparse.Namespace) -> ChatBackend | None:
    if args.judge != "llm":
        return None
    return make_backend(args.backend, args.model, adapter=args.adapter, base_url=args.base_url)


def _validate_judge_args(args: argparse.Namespace) -> str | None:
    if args.permutations < 1:
        return "--permutations must be at least 1"
    if args.max_turns < 1:
        return "--max-turns must be at least 1"
    if args.batch_groups < 1:
        return "--batch-groups must be at least 1"
    if args.judge == "llm":
        if not args.model:
            return "--judge llm needs --model (a local path or hub id; the served model name with --backend openai)"
        if args.backend == "openai" and not args.base_url:
            return "--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)"
        if args.answer_grammar == "on" and args.backend != "transformers":
            return ("--answer-grammar on needs --backend transformers (it scores the grammar's choices in-process); "
                    f"with --backend {args.backend} use auto or off")
    return None


def _run(
    groups: list[Group], args: argparse.Namespace, backend: ChatBackend | None, save: Any, label: str
) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    fallbacks = 0
    stats: Counter[str] = Counter()
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[current]}"), disable=args.no_progress, transient=False,
    ) as bar:
        task = bar.add_task(label, total=len(groups), current="")

        def done(res: Any) -> None:
            nonlocal fallbacks
            fallbacks += int(res.fallback)
            save(res)
            bar.update(task, advance=1, current=res.instance_id)

        grade_groups(
            groups, args.repos_dir, judge=args.judge, backend=backend, permutations=args.permutations,
            seed=args.seed, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
            batch_groups=args.batch_groups, on_result=done, stats=stats,
            answer_grammar={"auto": None, "on": True, "off": False}[args.answer_grammar],
        )
    if stats["replies"]:
        usable = stats["replies"] - stats["unusable_replies"]
        print(f"judge replies: {stats['replies']}, usable {usable} (parse rate {usable / stats['replies']:.3f}), "
              f"answers decoded in the grammar {stats['grammar_answers']}, "
              f"tool calls {stats['tool_calls']}, model batches {stats['batches']}")
    return fallbacks


def grade_main(argv: list[str]) -> int:
    prog = "gagar grade"
    p = argparse.ArgumentParser(prog=prog, description="Rank the passing candidates of each group.")
    p.add_argument("--groups", required=True, type=Path, help="groups JSONL (format: docs/contracts.md)")
    p.add_argument("--repos-dir", required=True, type=Path, help="holds <owner>__<name> git repositories")
    p.add_argument("--out", required=True, type=Path, help="output JSONL (written atomically, resumable)")
    p.add_argument("--redo", action="store_true", help="grade again the groups already in --out")
    _judge_options(p)
    args = p.parse_args(argv)
    bad = _validate_judge_args(args)
    if bad:
        return _fail(prog, bad)
    try:
        groups = load_groups(args.groups)
        bad = _check_repos(groups, args.repos_dir)
        if bad:
            return _fail(prog, bad)
        rows: list[dict[str, Any]] = []
        if args.out.exists() and not args.redo:
            want = {g.instance_id for g in groups}
            rows = [r for r in read_jsonl(args.out) if r.get("instance_id") in want]
    except InputError as exc:
        return _fail(prog, f"{exc}" + (" (use --redo to overwrite --out)" if str(args.out) in str(exc) else ""))
    done = {r["instance_id"] for r in rows}
    todo = [g for g in groups if g.instance_id not in done]
    try:
        backend = _backend(args) if todo else None
    except (ValueError, ImportError, OSError) as exc:
        return _fail(prog, f"cannot load the judge model: {exc}")

    def save(res: Any) -> None:
        rows.append(res.to_dict())
        write_jsonl_atomic(args.out, rows)  # after every group: an interrupted run resumes where it stopped

    try:
        fallbacks = _run(todo, args, backend, save, "grading")
    except InputError as exc:
        return _fail(prog, str(exc))
    if not todo:
        write_jsonl_atomic(args.out, rows)
    print(f"graded {len(todo)} group(s) ({len(done)} already in {args.out}), {fallbacks} heuristic fallback(s) "
          f"-> {args.out}")
    return 0


def eval_main(argv: list[str]) -> int:
    prog = "gagar grade eval"
    p = argparse.ArgumentParser(prog=prog, description="Top-1, pairwise accuracy and Kendall tau vs known orders.")
    p.add_argument("--groups", required=True, type=Path)
    p.add_argument("--labels", required=True, type=Path, help="JSONL: instance_id, order (best first)")
    p.add_argument("--repos-dir", type=Path, help="needed unless --gradings is given")
    p.add_argument("--gradings", type=Path, help="evaluate this `gagar grade` output instead of grading now")
    p.add_argument("--json", type=Path, help="also write the metrics here")
    _judge_options(p)
    args = p.parse_args(argv)
    bad = _validate_judge_args(args)
    if bad:
        return _fail(prog, bad)
    try:
        groups = load_groups(args.groups)
        gold: dict[str, list[str]] = {}
        for i, r in enumerate(read_jsonl(args.labels), 1):
            if not r.get("instance_id") or not isinstance(r.get("order"), list):
                raise InputError(f"{args.labels}: line {i} needs instance_id and order (a list of rollout ids)")
            gold[str(r["instance_id"])] = [str(x) for x in r["order"]]
        ids = {g.instance_id for g in groups}
        gold = {k: v for k, v in gold.items() if k in ids}
        if not gold:
            raise InputError(f"{args.labels}: no label matches an instance_id of {args.groups}")
        predicted: dict[str, list[str]] = {}
        fallbacks: int | None = None
        if args.gradings:
            predicted = {str(r["instance_id"]): [str(x) for x in r.get("ranking", [])] for r in read_jsonl(args.gradings)}
        else:
            if not args.repos_dir:
                raise InputError("--repos-dir is required unless --gradings is given")
            todo = [g for g in groups if g.instance_id in gold]
            bad = _check_repos(todo, args.repos_dir)
            if bad:
                return _fail(prog, bad)
            backend = _backend(args)
            fallbacks = _run(
                todo, args, backend, lambda res: predicted.__setitem__(res.instance_id, res.ranking), "judging"
            )
    except InputError as exc:
        return _fail(prog, str(exc))
    except (ValueError, ImportError, OSError) as exc:
        return _fail(prog, str(exc))
    m = evaluate(predicted, gold)
    judge = "gradings file" if args.gradings else args.judge
    if args.judge != "llm":
        fallbacks = None
    fb = "" if fallbacks is None else f"   heuristic fallbacks: {fallbacks}"
    print(f"judge: {judge}   instances: {m['instances']}   graded: {m['graded']}{fb}")
    print(f"top-1 accuracy:     {m['top1']:.3f}")
    print(f"pairwise accuracy:  {m['pairwise_accuracy']:.3f}")
    print(f"Kendall tau:        {m['kendall_tau']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"judge": judge, **m, **({"fallbacks": fallbacks} if fallbacks is not None else {})}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str]) -> int:
    """Entry point of `gagar grade`; `gagar grade eval ...` evaluates against known orders."""
    if argv and argv[0] == "eval":
        return eval_main(argv[1:])
    return grade_main(argv)
