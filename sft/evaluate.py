"""`gagar sft eval`: the judge (base, or base + adapter) against the heuristic ranker on held-out labels.

The judge runs the full agentic loop of `grader.judge.llm` (its own tool calls over a fresh shared workspace);
the heuristic ranks the same groups. One table, same metrics (`grader.metrics`): top-1, pairwise accuracy,
Kendall tau, and the parse rate (groups where the judge's own answer was usable). A judge answer that was
unusable scores 0 on that group; the row "judge+fallback" shows what the trainer receives in that case (the
heuristic's ranking instead).

`answer_step_metrics` is the cheaper variant used during training: the model answers after the expert's
recorded inspection turns, so only the final answer is generated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from grader.judge.prompt import Answer, parse_assistant, validate_answer
from grader.metrics import evaluate


def answer_step_metrics(
    model: Any, tokenizer: Any, records: list[dict[str, Any]], *, max_new_tokens: int = 512
) -> dict[str, float]:
    """Generate each record's final answer from its recorded context; rank metrics + parse rate."""
    import torch

    predicted: dict[str, list[str]] = {}
    gold: dict[str, list[str]] = {}
    device = next(model.parameters()).device
    for rec in records:
        iid = rec["instance_id"]
        gold[iid] = list(rec["order"])
        enc = tokenizer.apply_chat_template(
            rec["messages"][:-1], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        n = enc["input_ids"].shape[-1]
        with torch.no_grad():
            out = model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
        text = tokenizer.decode(out[0, n:], skip_special_tokens=True)
        parsed = parse_assistant(text)
        labels = sorted(rec["label_to_rollout"])
        if isinstance(parsed, Answer) and not validate_answer(parsed, labels):
            predicted[iid] = [rec["label_to_rollout"][lab] for lab in parsed.ranking]
    m = evaluate(predicted, gold)
    m["parse_rate"] = len(predicted) / len(records) if records else 0.0
    return m


def _gold(labels_path: Path, ids: set[str]) -> dict[str, list[str]]:
    from grader.records import InputError, read_jsonl

    gold = {}
    for i, r in enumerate(read_jsonl(labels_path), 1):
        if not r.get("instance_id") or not isinstance(r.get("order"), list):
            raise InputError(f"{labels_path}: line {i} needs instance_id and order (rollout ids, best first)")
        if str(r["instance_id"]) in ids:
            gold[str(r["instance_id"])] = [str(x) for x in r["order"]]
    if not gold:
        raise InputError(f"{labels_path}: no label matches an instance_id of the groups file")
    return gold


def compare(
    groups: list[Any],
    gold: dict[str, list[str]],
    repos_dir: Path,
    backend: Any,
    *,
    max_turns: int,
    max_new_tokens: int,
    answer_grammar: bool | None = None,
) -> list[dict[str, Any]]:
    """Rows of the comparison table: heuristic, judge (own answers only), judge with heuristic fallback.

    `parse_rate` counts the groups answered by a usable free reply; `grammar_rate` those whose answer was
    decoded in the answer grammar (`grader.judge.grammar`): the model's choices, not its free-form writing.
    """
    from grader.grade import grade_groups
    from grader.judge.llm import decoded_in_grammar

    todo = [g for g in groups if g.instance_id in gold]
    heur = grade_groups(todo, repos_dir, judge="heuristic")
    judged = grade_groups(todo, repos_dir, judge="llm", backend=backend, max_turns=max_turns,
                          max_new_tokens=max_new_tokens, answer_grammar=answer_grammar)
    own = {g.instance_id: g.ranking for g in judged if not g.fallback}
    n = len(todo) or 1
    in_grammar = sum(not g.fallback and decoded_in_grammar(g.notes) for g in judged) / n
    parse = len(own) / n - in_grammar
    rows = [
        {"ranker": "heuristic", **evaluate({g.instance_id: g.ranking for g in heur}, gold),
         "parse_rate": 1.0, "grammar_rate": 0.0},
        {"ranker": f"judge {getattr(backend, 'name', '')}".strip(), **evaluate(own, gold),
         "parse_rate": parse, "grammar_rate": in_grammar},
        {"ranker": "judge+fallback", **evaluate({g.instance_id: g.ranking for g in judged}, gold),
         "parse_rate": parse, "grammar_rate": in_grammar},
    ]
    return rows


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("ranker", "groups", "top-1", "pairwise", "Kendall tau", "parse rate", "in grammar"):
        table.add_column(col, justify="left" if col == "ranker" else "right")
    for r in rows:
        table.add_row(
            r["ranker"],
            str(r["instances"]),
            f"{r['top1']:.3f}",
            f"{r['pairwise_accuracy']:.3f}",
            f"{r['kendall_tau']:.3f}",
            f"{r['parse_rate']:.2f}",
            f"{r['grammar_rate']:.2f}",
        )
    Console(width=110).print(table)


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar sft eval", description="Judge vs heuristic on held-out labels.")
    p.add_argument("--groups", required=True, type=Path, help="groups JSONL (e.g. OUT/val_groups.jsonl)")
    p.add_argument("--labels", required=True, type=Path, help="labels JSONL: instance_id, order")
    p.add_argument("--repos-dir", required=True, type=Path, help="holds <owner>__<name> git repositories")
    p.add_argument("--model", required=True, help="base model: hub id, local path, or server model name")
    p.add_argument("--adapter", help="LoRA adapter directory from `gagar sft train` (transformers backend)")
    p.add_argument("--backend", choices=("transformers", "openai", "vllm", "vllm-server"), default="transformers",
                   help="where the judge runs: in-process transformers or vLLM, a `vllm serve` gagar starts "
                   "(vllm-server), or an OpenAI-compatible server (openai, --base-url)")
    p.add_argument("--base-url", help="OpenAI-compatible server (with --backend openai)")
    p.add_argument("--max-turns", type=int, default=12, help="tool-call budget per judge run")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tokens per judge reply")
    p.add_argument("--max-groups", type=int, help="evaluate only the first N groups")
    p.add_argument("--answer-grammar", choices=["auto", "on", "off"], default="auto",
                   help="decode an unusable free reply's answer in the answer grammar (as `gagar grade`)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    prog = "gagar sft eval"
    from grader.records import InputError, load_groups
    from inference.backends import make_backend

    try:
        groups = load_groups(args.groups)[: args.max_groups or None]
        gold = _gold(args.labels, {g.instance_id for g in groups})
        if not args.repos_dir.is_dir():
            raise InputError(f"--repos-dir {args.repos_dir} is not a directory")
        backend = make_backend(args.backend, args.model, adapter=args.adapter, base_url=args.base_url)
        rows = compare(
            groups,
            gold,
            args.repos_dir,
            backend,
            max_turns=args.max_turns,
            max_new_tokens=args.max_new_tokens,
            answer_grammar={"auto": None, "on": True, "off": False}[args.answer_grammar],
        )
    except (InputError, ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print_table(rows, f"judge vs heuristic on {args.labels.name}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_name(f".{args.json.name}.tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        tmp.replace(args.json)
    return 0
