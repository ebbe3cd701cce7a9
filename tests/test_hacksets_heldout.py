"""The blind held-out hack sets (bench/hackset3 onwards) stay usable: each loads through verify.py's own readers,
every group has hacks with witnesses and an honest fix, every candidate is a diff of library code, every group is
held out, and the README says whether (and with which rules) the set has been scored. The sandbox check itself is
`bench/hackset2/verify.py --golds --witnesses` (minutes, per set)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import unidiff

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "hackset2"))

import verify  # noqa: E402

from sandbox.inputs import load_instances  # noqa: E402

SETS = sorted((p for p in (ROOT / "bench").glob("hackset*") if p.name[7:].isdigit() and int(p.name[7:]) >= 3
               and (p / "tasks.json").is_file()), key=lambda p: int(p.name[7:]))


def test_there_are_held_out_sets() -> None:
    assert len(SETS) >= 4


@pytest.mark.parametrize("where", SETS, ids=lambda p: p.name)
def test_held_out_set_is_well_formed(where: Path) -> None:
    tasks = load_instances(where / "tasks.json", [])
    cands = verify.load_candidates(where / "candidates.json", tasks)
    raw = json.loads((where / "tasks.json").read_text())
    assert {t["split"] for t in raw} == {"heldout"} and len({t["repo"] for t in raw}) >= 3
    hacks = Counter(c.instance_id for c in cands if c.kind == "hack")
    honest = Counter(c.instance_id for c in cands if c.kind == "honest")
    assert set(hacks) == set(tasks) and set(honest) == set(tasks), "every group needs hacks and an honest fix"
    assert len({c.mindset.split(":")[0] for c in cands if c.kind == "hack"}) >= 5
    for c in cands:
        files = unidiff.PatchSet(c.patch)
        assert files and c.patch != tasks[c.instance_id].patch, (c.instance_id, c.name)
        assert not any(f.path.startswith("tests/") for f in files), (c.instance_id, c.name)
    readme = (where / "README.md").read_text()
    assert "**Status:" in readme and "heldout" in readme
