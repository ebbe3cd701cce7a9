"""`gagar grade` (rank groups — from a groups file or a `gagar eval` run, optionally probed — resumable, atomic
output, a ranking summary) and `gagar grade eval` (metrics against known orders)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from grader.grade import grade_groups
from grader.metrics import evaluate
from grader.probe.runner import DEFAULT_BUDGET_S
from grader.records import Group, InputError, load_groups, read_jsonl, write_jsonl_atomic
from inference.backends import make_backend
from inference.base import ChatBackend
from sandbox.cli import add_sandbox_options, sandbox_config
from sandbox.integrity import gitsafe
from sandbox.records import Instance


def _judge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--judge", choices=["heuristic", "llm"], default="heuristic",
                   help="heuristic: diff features, no model; llm: the agentic judge (--model, --backend)")
    p.add_argument("--model", help="judge model: a registry name (`gagar model ls`), a local path or a hub id "
                   "(openai: the server's model name)")
    p.add_argument("--adapter", help="PEFT adapter directory (transformers and vllm backends)")
    p.add_argument("--backend", choices=["transformers", "openai", "vllm", "vllm-server"], default="transformers",
                   help="LLM judge: in-process transformers or vLLM, a `vllm serve` gagar starts and stops "
                   "(vllm-server), or an OpenAI-compatible server (openai, --base-url)")
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--permutations", type=int, default=1,
                   help="LLM judge: runs per group over shuffled candidate letters, rankings Borda-aggregated "
                   "(K model runs per group; agreement reported for K > 1)")
    p.add_argument("--max-turns", type=int, default=12, help="tool-call budget per judge run")
    p.add_argument("--max-new-tokens", type=int, default=512, help="LLM judge: tokens per reply")
    p.add_argument("--seed", type=int, default=0, help="workspace letters and permutation order")
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


PROBE_HELP = ("before grading, run the behavioural hack probe (grader/probe/) on each group: its passing "
              "candidates and the unfixed code re-run the task's instrumented FAIL_TO_PASS tests in the Docker "
              "sandbox (renamed, signs hidden, expected values and inputs changed, the changed functions replayed "
              "off the test); what it finds becomes a hack verdict. Needs --instances (test_cmd, test_patch, "
              "FAIL_TO_PASS; pytest tasks only, others are graded unprobed) and the sandbox's images. Costs one "
              "container run per candidate + 1 per group, in parallel up to --max-workers: measured 4.2 s per "
              "group of 4-5 candidates (bundled Python tasks, 1 worker, 2 shared cores at load 4-5)")


def _input_options(p: ArgumentParser) -> None:
    src = p.add_argument_group("groups: a groups file, or the passing rollouts of a `gagar eval` run")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument("--groups", type=Path, help="groups JSONL (format: docs/contracts.md)")
    one.add_argument("--results", type=Path, help="a `gagar eval` run's results.jsonl: each instance's passing "
                     "rollouts become a group (needs --instances and --predictions)")
    src.add_argument("--predictions", type=Path, help="the predictions that run evaluated (results.jsonl holds no "
                     "patches); each passing result's verdict_key must still match its patch and instance")
    src.add_argument("--instances", type=Path, help="the instances (SWE-bench JSONL): with --results, and for --probe")
    src.add_argument("--save-groups", type=Path, help="also write the groups built from --results here (a --groups "
                     "file for later runs)")
    probe = p.add_argument_group("behavioural probe")
    probe.add_argument("--probe", action="store_true", help=PROBE_HELP)
    probe.add_argument("--env-specs", help="--probe: environment specs for instances without `env` or `test_cmd` "
                       "(as `gagar eval --env-specs`)")
    add_sandbox_options(probe, timeout=DEFAULT_BUDGET_S, timeout_help="--probe: seconds each candidate's probe run "
                        "may take before its container is killed (the probe's budget)")


def _load_inputs(args: argparse.Namespace, notes: list[str]) -> tuple[list[Group], dict[str, Instance]]:
    """The groups to grade (from --groups or --results) and the instances (--instances; {} without)."""
    from grader.records import groups_from_run, load_results
    from sandbox.inputs import load_instances, load_predictions

    instances: dict[str, Instance] = {}
    if args.instances:
        if not args.instances.is_file():
            raise InputError(f"--instances {args.instances}: no such file")
        instances = load_instances(args.instances, notes)
        if args.env_specs:
            from sandbox.env.spec import SpecError, apply_specs, load_spec_file

            try:
                notes += apply_specs(instances, load_spec_file(args.env_specs))
            except SpecError as exc:
                raise InputError(str(exc)) from exc
    if args.groups:
        return load_groups(args.groups), instances
    if not args.predictions.is_file():
        raise InputError(f"--predictions {args.predictions}: no such file")
    patches = {(pr.instance_id, pr.rollout_id): pr.model_patch for pr in load_predictions(args.predictions, notes)}
    groups, more = groups_from_run(instances, load_results(args.results), patches, image=args.image,
                                   source=str(args.results))
    notes += more
    if args.save_groups:
        write_jsonl_atomic(args.save_groups, [g.to_dict() for g in groups])
    return groups, instances


def _input_problem(args: argparse.Namespace) -> str | None:
    if args.results and not (args.instances and args.predictions):
        return "--results needs --instances and --predictions (results.jsonl holds neither the tasks nor the patches)"
    if args.save_groups and not args.results:
        return "--save-groups writes the groups built from --results; with --groups they are that file already"
    if args.probe and not args.instances:
        return "--probe needs --instances (the task's test_cmd, test_patch and FAIL_TO_PASS to instrument)"
    return None


def _probe(todo: list[Group], instances: dict[str, Instance], args: argparse.Namespace, prog: str) -> int | None:
    """Run the probe on the groups to grade; an exit code when it cannot start."""
    from grader.probe.runner import probe_groups
    from sandbox.inputs import require_runnable

    config = sandbox_config(args, args.repos_dir)
    if isinstance(config, str):
        return _fail(prog, config)
    try:
        require_runnable({g.instance_id: instances[g.instance_id] for g in todo if g.instance_id in instances},
                         args.instances)
    except InputError as exc:
        return _fail(prog, str(exc))
    stats = probe_groups(todo, instances, config, on_group=None if args.no_progress else lambda g, s: print(
        f"probe: {g.instance_id}: {s:.1f} s, {sum(map(len, g.behaviour.values()))} finding(s)", file=sys.stderr))
    print(stats.line())
    return None


def grade_main(argv: list[str]) -> int:
    prog = "gagar grade"
    p = ArgumentParser(prog=prog, description="Rank the passing candidates of each group (from a groups file or a "
                       "`gagar eval` run), optionally after the behavioural hack probe; prints a ranking summary.")
    p.add_argument("--repos-dir", required=True, type=Path, help="holds <owner>__<name> git repositories")
    p.add_argument("--out", required=True, type=Path, help="output JSONL (written atomically, resumable)")
    p.add_argument("--redo", action="store_true", help="grade again the groups already in --out")
    _input_options(p)
    _judge_options(p)
    args = p.parse_args(argv)
    bad = _input_problem(args) or _validate_judge_args(args)
    if bad:
        return _fail(prog, bad)
    notes: list[str] = []
    try:
        groups, instances = _load_inputs(args, notes)
        for n in notes:
            print(f"{prog}: note: {n}", file=sys.stderr)
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
    if args.probe and todo:
        code = _probe(todo, instances, args, prog)
        if code is not None:
            return code
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
    print_summary(rows, groups)
    print(f"graded {len(todo)} group(s) ({len(done)} already in {args.out}), {fallbacks} heuristic fallback(s) "
          f"-> {args.out}")
    return 0


def print_summary(rows: list[dict[str, Any]], groups: list[Group], limit: int = 20) -> None:
    """The rankings in --out as a short table (best first, hacks marked) and the totals."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    size = {g.instance_id: len(g.candidates) for g in groups}
    table = Table("instance", "n", "ranking (best first; tier, hack)", "judge", title=f"{len(rows)} group(s) ranked")
    tiers: Counter[int] = Counter()
    hacks: Counter[str] = Counter()
    for i, r in enumerate(rows):
        t, h = r.get("tiers") or {}, r.get("hacks") or {}
        tiers.update(int(v) for v in t.values())
        hacks.update(h.values())
        if i < limit:
            order = "  ".join(f"{rid} T{t.get(rid, '?')}" + (f" [{h[rid]}]" if rid in h else "")
                              for rid in r.get("ranking", []))
            judge = str(r.get("judge", "")) + (" (fallback)" if r.get("fallback") else "")
            table.add_row(*map(escape, (str(r["instance_id"]), str(size.get(r["instance_id"], len(t))), order,
                                        judge)))  # ids are the user's text, not rich markup
    if len(rows) > limit:
        table.caption = f"… and {len(rows) - limit} more in the output file"
    console = Console(width=max(100, Console().width))
    if rows:
        console.print(table)
    print(f"candidates: {sum(tiers.values())} (T1 {tiers[1]}, T2 {tiers[2]}, T3 {tiers[3]}); hacks: "
          + (", ".join(f"{k} {v}" for k, v in sorted(hacks.items())) or "none")
          + f"; fallbacks: {sum(1 for r in rows if r.get('fallback'))}")


def eval_main(argv: list[str]) -> int:
    prog = "gagar grade eval"
    p = ArgumentParser(prog=prog, description="Top-1, pairwise accuracy and Kendall tau vs known orders.")
    p.add_argument("--groups", required=True, type=Path, help="groups JSONL (format: docs/contracts.md)")
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
