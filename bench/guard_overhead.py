#!/usr/bin/env python3
"""What the round-4 defences (issue 36) cost per rollout, measured where they run (not a timed test).

- in the container: the pytest guard plugin's cost — suites of 1 and N trivial tests in the `gagar-python` image
  (pytest 7.2), run without the plugin and with it (records written to /dev/null), interleaved: the CPU seconds
  (user + system) of the pytest process, which a busy machine disturbs far less than wall time. The 1-test
  suite gives the fixed cost (import, fingerprint), the N-test one the cost per test;
- on the host: a metadata snapshot of a work tree of F files (`sandbox.integrity.treefs.snapshot`; applying takes
  two, the pre-run step one) and the diff of two snapshots, in CPU time of this process.

    .venv/bin/python bench/guard_overhead.py [--tests 2000] [--files 7000] [--repeats 5] [--guard-dir DIR]

`--guard-dir` measures another version of the plugin (e.g. main's `sandbox/integrity/guest`). Prints a table and
writes bench/results/guard_overhead.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.integrity import treefs  # noqa: E402
from sandbox.integrity.channel import GUEST_DIR  # noqa: E402

_CPU = re.compile(r"^CPU ([0-9.]+)$", re.M)
# pytest in-process, then the CPU time it used (imports included, the same with and without the plugin).
_RUN = ("import resource, sys, pytest\nrc = pytest.main(sys.argv[1:])\n"
        "r = resource.getrusage(resource.RUSAGE_SELF)\nprint('CPU', r.ru_utime + r.ru_stime)\n")


def _shown(path: Path) -> str:
    """The plugin's folder as results name it: relative to the repository, never a local absolute path."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def suite_seconds(work: Path, guard_dir: Path, guarded: bool, image: str) -> float:
    plugin = ["-p", "gagar_pytest_guard"] if guarded else []
    cmd = ["docker", "run", "--rm", "--network", "none", "-v", f"{work}:/w", "-v", f"{guard_dir}:/gagar/lib:ro",
           "-w", "/w", "-e", "PYTHONPATH=/gagar/lib", "-e", "GAGAR_RESULT_PIPE=/dev/null", image, "python3", "-c",
           _RUN, "-q", "-p", "no:cacheprovider", *plugin, "--junitxml=/tmp/j.xml", "tests"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900).stdout
    m = _CPU.search(out)
    if not m or " passed" not in out:
        raise RuntimeError(f"no CPU time or no passing run in: {out[-800:]}")
    return float(m.group(1))


def synthetic_tree(root: Path, files: int) -> None:
    """A repository-shaped tree: 10 files a directory, directories 3 deep."""
    for i in range(files):
        d = root / f"pkg{i // 1000}" / f"mod{i // 100 % 10}" / f"sub{i // 10 % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text("x = 1\n" * 20)


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--tests", type=int, default=2000)
    p.add_argument("--files", type=int, default=7000, help="files in the synthetic tree (Django has ~6,800)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--guard-dir", type=Path, default=GUEST_DIR)
    p.add_argument("--image", default="gagar-python:latest")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "guard_overhead.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gagar-guard-bench-") as tmp:
        suites = {}
        for n in (1, args.tests):  # one test: the plugin's fixed cost (import, fingerprint); N: plus N checks
            suites[n] = Path(tmp) / f"suite{n}"
            (suites[n] / "tests").mkdir(parents=True)
            (suites[n] / "tests" / "test_many.py").write_text(
                "".join(f"def test_{i}():\n    assert {i} == {i}\n\n\n" for i in range(n)))
        os.chmod(tmp, 0o755)
        times: dict[tuple[int, bool], list[float]] = {(n, g): [] for n in suites for g in (False, True)}
        suite_seconds(suites[args.tests], args.guard_dir.resolve(), True, args.image)  # warm caches and the image
        for _ in range(args.repeats):
            for (n, guarded), got in times.items():
                got.append(suite_seconds(suites[n], args.guard_dir.resolve(), guarded, args.image))
        tree = Path(tmp) / "tree"
        synthetic_tree(tree, args.files)
        snap, diff = [], []
        for _ in range(args.repeats):
            t0 = time.process_time()
            a = treefs.snapshot(tree)
            t1 = time.process_time()
            b = treefs.snapshot(tree)
            t2 = time.process_time()
            treefs.changes(a, b)
            snap.append(t1 - t0)
            diff.append(time.process_time() - t2)
    med = {k: statistics.median(v) for k, v in times.items()}
    fixed = med[1, True] - med[1, False]
    per_test = (med[args.tests, True] - med[args.tests, False] - fixed) / max(args.tests - 1, 1)
    figures = {
        "tests": args.tests, "suite_cpu_s_without_guard": med[args.tests, False],
        "suite_cpu_s_with_guard": med[args.tests, True], "guard_fixed_cpu_ms": round(fixed * 1000, 1),
        "guard_cpu_ms_per_test": round(per_test * 1000, 3),
        "tree_files": args.files, "snapshot_ms": round(statistics.median(snap) * 1000, 1),
        "changes_ms": round(statistics.median(diff) * 1000, 1),
        "guard_dir": _shown(args.guard_dir), "image": args.image,
    }
    doc = {"figures": figures, "raw": {f"{n} tests, {'with' if g else 'without'} guard": v
                                       for (n, g), v in times.items()} | {"snapshot_s": snap},
           "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                       "load": os.getloadavg()}, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, v in figures.items():
        print(f"{k:24} {v}")
    print(f"written: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
