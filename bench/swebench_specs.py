#!/usr/bin/env python3
"""Write SWE-bench's environment specs as a `--env-specs` file, from an installed `swebench` ≤ 4.1 (the last
releases with MAP_REPO_VERSION_TO_SPECS), each spec with its repo's `log_parser`.

    python bench/swebench_specs.py --out bench/data/swebench-4.1.0-specs.json

Run it with a Python that has `swebench` ≤ 4.1 (a scratch venv: `pip install swebench==4.1.0`); gagar itself
never depends on the package. The file it writes is what `--env-specs FILE` and `bench/environments.py
--swebench` read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.env.swebench import SWEbenchError, package_specs, swebench_version  # noqa: E402


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        specs = package_specs()
    except SWEbenchError as exc:
        print(f"swebench_specs: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_jsonable(specs), indent=1, sort_keys=True) + "\n")
    n = sum(len(v) for v in specs.values())
    print(f"swebench {swebench_version()}: {len(specs)} repos, {n} (repo, version) specs → {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
