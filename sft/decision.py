"""The scoring judge's training objective and its confidence rule: `gagar sft calibrate`.

Training (`gagar sft train` with `objective: decision`): each pair record (`sft.pairs`) is tokenized as the judge
reads it at inference — the chat template's prompt, ready for the assistant's reply, then the answer letter — and
only the answer token carries loss (TRL `SFTTrainer`, pre-tokenized `input_ids` with a `completion_mask` on that
one token; TRL's fused LM head then projects that one position only). The loss is the model's cross-entropy on
"A" vs "B" and nothing else: no evidence prose, no format to learn.

`gagar sft calibrate` scores calibration groups (`calib_groups.jsonl`: training projects that gave no training
record, never held-out ones) once with the trained scorer, and picks the combined judge's confidence: the
threshold on |P(x ≻ y) − ½| above which the learned verdict replaces the heuristic's order. The grid runs from 0
(the learned scorer alone) to 0.5 (the heuristic alone); the chosen value has the best mean pairwise accuracy,
then top-1, and on a tie the larger threshold (the heuristic's order wherever the learned verdicts add nothing).
The result is written beside the adapter (`score_calibration.json`), where `gagar grade --judge combined` reads it.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from grader.judge.scoring import CALIBRATION_FILE
from grader.metrics import pairwise_accuracy, top1
from grader.records import InputError
from sft.pairs import decision_prompt
from sft.records import RecordError

GRID = tuple(round(0.025 * i, 3) for i in range(21))  # 0, 0.025, ..., 0.5


def tokenize_decision(tokenizer: Any, record: dict[str, Any]) -> dict[str, Any]:
    """`input_ids` (the prompt as the chat template renders it for the reply, then the answer) and a
    `completion_mask` that is 1 on the answer token only: the ids `score_continuations` reads at inference
    (`inference.base.option_rows`, the one tokenization of both). Every answer must be one token after the
    prompt's own."""
    from grader.judge.scoring import ANSWERS
    from inference.base import BackendError, one_token_options, option_rows

    prompt, answer = decision_prompt(record)
    try:
        seqs, start = option_rows(tokenizer, prompt, "", list(ANSWERS))
    except BackendError as exc:
        raise RecordError(f"{record.get('instance_id')}: {exc}") from exc
    if one_token_options(seqs, start) is None:
        raise RecordError(f"{record.get('instance_id')}: the answers {', '.join(ANSWERS)} are not one token each "
                          "after the prompt with this tokenizer (the scoring judge reads one token's probability)")
    ids = seqs[ANSWERS.index(answer)]
    return {"input_ids": ids, "completion_mask": [0] * start + [1], "bigger_wins": record.get("bigger_wins")}


def balance_by_size(records: list[dict[str, Any]], *, seed: int = 0
                    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """As many pairs whose better patch is the bigger one as pairs whose better patch is the smaller one: the
    larger side is subsampled (seeded), both orders of a pair kept together; same-size pairs are all kept."""
    pairs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        pairs.setdefault((str(r.get("instance_id")), str(r.get("better")), str(r.get("worse"))), []).append(r)
    sides: dict[Any, list[tuple[str, str, str]]] = {True: [], False: [], None: []}
    for key, recs in pairs.items():
        sides[recs[0].get("bigger_wins")].append(key)
    n = min(len(sides[True]), len(sides[False]))
    rng = random.Random(seed)
    keep = set(sides[None])
    for side in (True, False):
        keep |= set(rng.sample(sides[side], n) if len(sides[side]) > n else sides[side])
    out = [r for key, recs in pairs.items() if key in keep for r in recs]
    return out, {"bigger_wins_pairs": len(sides[True]), "smaller_wins_pairs": len(sides[False]),
                 "same_size_pairs": len(sides[None]), "kept_per_side": n, "records": len(out)}


def sweep(verdicts: list[Any], gold: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Top-1, mean pairwise accuracy and the learned verdicts' share of pairs for each threshold of `GRID`."""
    from grader.judge.scoring import rank_verdicts

    rows = []
    for tau in GRID:
        t1 = pw = 0.0
        learned = total = 0
        for v in verdicts:
            ranking, decided = rank_verdicts(v, tau)
            order = gold[v.heuristic.instance_id]
            t1 += top1(ranking, order)
            pw += pairwise_accuracy(ranking, order)
            learned += sum(d for _, d in decided.values())
            total += len(decided)
        n = max(1, len(verdicts))
        rows.append({"confidence": tau, "top1": round(t1 / n, 4), "pairwise": round(pw / n, 4),
                     "learned_share": round(learned / max(1, total), 4)})
    return rows


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best row of a sweep: pairwise, then top-1, then the larger threshold."""
    return max(rows, key=lambda r: (r["pairwise"], r["top1"], r["confidence"]))


def calibrate(groups: list[Any], gold: dict[str, list[str]], repos_dir: Path, backend: Any, *,
              batch_groups: int = 8) -> dict[str, Any]:
    """Score the groups once and sweep the confidence threshold; the report `score_calibration.json` holds."""
    from contextlib import ExitStack

    from grader.judge.scoring import ScoringJudge
    from grader.workspace import SharedWorkspace

    judge = ScoringJudge(backend)
    verdicts = []
    t0 = time.perf_counter()
    for i in range(0, len(groups), batch_groups):
        with ExitStack() as stack:
            wss = [stack.enter_context(SharedWorkspace(g, repos_dir)) for g in groups[i:i + batch_groups]]
            verdicts += judge.verdicts(wss)
        print(f"  calibration: {min(i + batch_groups, len(groups))}/{len(groups)} groups", flush=True)
    rows = sweep(verdicts, gold)
    best = choose(rows)
    return {"confidence": best["confidence"], "chosen": best, "groups": len(groups),
            "repos": sorted({g.repo for g in groups}), "sweep": rows, "scorer": rows[0], "heuristic": rows[-1],
            "seconds": round(time.perf_counter() - t0, 1), "judge": judge.name}


def main(argv: list[str]) -> int:
    from grader.records import load_groups, read_jsonl
    from sandbox.jsonl import atomic_write_text

    prog = "gagar sft calibrate"
    p = ArgumentParser(prog=prog, description="Choose the combined judge's confidence threshold on "
                                "calibration groups (training projects, never held-out ones).")
    p.add_argument("--groups", required=True, type=Path, help="calib_groups.jsonl of `gagar sft data`")
    p.add_argument("--labels", required=True, type=Path, help="calib_labels.jsonl (known orders)")
    p.add_argument("--repos-dir", required=True, type=Path, help="the groups' repositories (`gagar sft data` OUT/repos)")
    p.add_argument("--model", required=True, help="base model: registry name, path or hub id")
    p.add_argument("--adapter", required=True, type=Path, help="the scoring judge's adapter")
    p.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    p.add_argument("--every", type=int, default=1, help="every N-th group")
    p.add_argument("--max-groups", type=int, help="at most N groups (after --every)")
    p.add_argument("--out", type=Path, help=f"default: ADAPTER/{CALIBRATION_FILE}")
    args = p.parse_args(argv)
    if args.every < 1 or (args.max_groups is not None and args.max_groups < 1):
        print(f"{prog}: --every and --max-groups must be at least 1", file=sys.stderr)
        return 2
    if not args.adapter.is_dir():
        print(f"{prog}: --adapter {args.adapter} is not a directory (train it with `gagar sft train`)",
              file=sys.stderr)
        return 2
    try:
        groups = load_groups(args.groups)[:: args.every][: args.max_groups or None]
        gold = {str(r["instance_id"]): [str(x) for x in r["order"]] for r in read_jsonl(args.labels)
                if isinstance(r, dict) and "instance_id" in r and isinstance(r.get("order"), list)}
        missing = [g.instance_id for g in groups if g.instance_id not in gold]
        if missing:
            raise InputError(f"{args.labels}: no known order for {', '.join(missing[:5])}")
        if not groups:
            raise InputError(f"{args.groups}: no groups (was the data built with --calib-fraction?)")
        from inference.backends import make_backend

        backend = make_backend(args.backend, args.model, adapter=str(args.adapter))
        report = calibrate(groups, gold, args.repos_dir, backend)
    except (InputError, OSError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.adapter / CALIBRATION_FILE
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    c = report["chosen"]
    print(f"{prog}: confidence {report['confidence']:g} on {report['groups']} groups "
          f"(pairwise {c['pairwise']:.3f}, top-1 {c['top1']:.3f}, learned verdicts {c['learned_share']:.2f} of "
          f"pairs; scorer alone {report['scorer']['pairwise']:.3f}, heuristic alone "
          f"{report['heuristic']['pairwise']:.3f}) -> {out}")
    return 0
