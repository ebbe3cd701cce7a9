"""`gagar sft {history,data,train,calibrate,eval}` — judge training data, fine-tuning and evaluation."""

from __future__ import annotations

import sys

USAGE = """usage: gagar sft COMMAND [ARGS...]

commands:
  history gold fixes from real repositories' histories, as instances (split by repository)
  data    build judge training records with known-order labels (synthetic or from `gagar eval` results)
  train   LoRA SFT of the judge from a YAML config (TRL SFTTrainer + PEFT)
  calibrate  choose the combined judge's confidence threshold on calibration groups (never held-out ones)
  eval    the judge (base or base + adapter) against the heuristic ranker on held-out labels

Run `gagar sft COMMAND --help` for a command's options."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0 if argv else 2
    word, rest = argv[0], argv[1:]
    if word == "history":
        from sft.history import main as run
    elif word == "data":
        from sft.data import main as run
    elif word == "train":
        from sft.train import main as run
    elif word == "calibrate":
        from sft.decision import main as run
    elif word == "eval":
        from sft.evaluate import main as run
    else:
        print(f"gagar sft: unknown command {word!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)
