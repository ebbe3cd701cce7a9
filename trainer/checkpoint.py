"""Checkpoints: `OUT/checkpoints/step_NNNNNN/` with the trainable weights (LoRA adapter or full model), the
optimiser state and `state.json` (step, task cursor, RNG). Written to a temp dir and renamed into place, so a
crash mid-save never leaves a checkpoint that `--resume` would pick up half-written."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step_(\d{6})$")


def checkpoint_dir(out: Path) -> Path:
    return Path(out) / "checkpoints"


def latest_checkpoint(out: Path) -> Path | None:
    root = checkpoint_dir(out)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if _NAME.match(p.name) and (p / "state.json").is_file())
    return done[-1] if done else None


def save_checkpoint(out: Path, step: int, model: Any, optimizer: torch.optim.Optimizer, state: dict,
                    keep: int = 2) -> Path:
    root = checkpoint_dir(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        model.save_pretrained(str(tmp / "weights"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    old = sorted(p for p in root.iterdir() if _NAME.match(p.name))[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "state.json").read_text())


def restore_optimizer(ckpt: Path, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
    rng = torch.load(ckpt / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])


def resume_point(out: Path, resume: bool, log: Any = print) -> tuple[Path | None, dict]:
    """(latest checkpoint, its state) when resuming, else (None, {})."""
    if not resume:
        return None, {}
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        log(f"--resume: no checkpoint under {checkpoint_dir(out)}; starting from step 0")
        return None, {}
    state = load_state(ckpt)
    log(f"resumed from {ckpt} (step {int(state['step'])})")
    return ckpt, state
