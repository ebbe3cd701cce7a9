#!/usr/bin/env python3
"""Sandbox benchmark (not a timed test): what the sandbox costs over running the tests on the host, and how a
group of 8 rollouts of one instance scales with 1 and 2 workers.

    .venv/bin/python bench/sandbox.py [--instance ID] [--repeats 7] [--tasks DIR]

Prints a table and writes bench/results/sandbox.json. Targets: median overhead <= 0.5 s; a group of 8 costs
<= 1.5x the wall time of 8 single evaluations divided by the workers in use.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox import container as ctr  # noqa: E402
from sandbox.apply import apply_patch, restore_task_tests  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.patchcheck import validate_patch  # noqa: E402
from sandbox.records import Instance, Prediction  # noqa: E402
from sandbox.run import evaluate_predictions  # noqa: E402
from sandbox.workspace import GroupWorkspace  # noqa: E402


def host_run(inst: Instance, repos: Path) -> float:
    """The same tests, patched the same way, run directly on the host (the venv's Python and pytest)."""
    with GroupWorkspace(repos, inst.repo, inst.base_commit) as ws:
        tree = ws.copy()
        info = validate_patch(inst.patch, tree)
        assert apply_patch(tree, inst.patch, base_commit=inst.base_commit).applied
        restore_task_tests(tree, base_commit=inst.base_commit, test_patch=inst.test_patch, model_patch_info=info)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               "PYTEST_ADDOPTS": "-p no:cacheprovider", "PYTHONDONTWRITEBYTECODE": "1",
               # the image's pytest has no plugins; the venv's hypothesis/timeout plugins would skew the host side
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", inst.test_cmd], cwd=tree, env=env, capture_output=True)
        dt = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout.decode()[-2000:]
        return dt


TEST_TIMES: list[float] = []
_go = ctr.PreparedRun.go


def _timed_go(self, **kw):  # records how long the test command itself ran in its container
    out = _go(self, **kw)
    TEST_TIMES.append(out.duration_s)
    return out


ctr.PreparedRun.go = _timed_go


def sandbox_run(inst: Instance, preds: list[Prediction], cfg: SandboxConfig) -> tuple[float, list[float]]:
    t0 = time.monotonic()
    results = evaluate_predictions({inst.instance_id: inst}, preds, cfg)
    wall = time.monotonic() - t0
    bad = [r for r in results if r.status != "resolved"]
    assert not bad, [(r.status, r.error) for r in bad]
    return wall, [r.duration_s for r in results]


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, help="bundled tasks dir (built into a temp dir when omitted)")
    p.add_argument("--instance", help="instance id (default: the first Python task)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sandbox.json")
    args = p.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="gagar-bench-")
    tasks = args.tasks or Path(tmp.name) / "tasks"
    if not (tasks / "instances.jsonl").exists():
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--out", str(tasks)], check=True,
                       capture_output=True)
    insts = [Instance.from_dict(json.loads(ln)) for ln in (tasks / "instances.jsonl").read_text().splitlines()
             if ln.strip()]
    inst = next(i for i in insts if (i.instance_id == args.instance if args.instance else i.language == "python"))
    repos = tasks / "repos"
    cfg = SandboxConfig(repos_dir=repos, run_id="bench")
    gold = lambda rid: Prediction(inst.instance_id, inst.patch, "bench", str(rid))  # noqa: E731

    sandbox_run(inst, [gold("warm")], cfg)  # warm the page cache and the image layers
    host, single, single_rollout, own = [], [], [], []
    load0 = os.getloadavg()[0]
    for i in range(args.repeats):
        host.append(host_run(inst, repos))
        wall, (d,) = sandbox_run(inst, [gold(i)], cfg)
        single.append(wall)
        single_rollout.append(d)
        own.append(wall - TEST_TIMES[-1])
    host_med, single_med = statistics.median(host), statistics.median(single)
    group = {}
    for workers in (1, 2):
        cfg_w = SandboxConfig(repos_dir=repos, run_id="bench", max_workers=workers)
        walls, owns = [], []
        for _ in range(max(1, args.repeats // 3)):
            n0 = len(TEST_TIMES)
            walls.append(sandbox_run(inst, [gold(f"g{k}") for k in range(8)], cfg_w)[0])
            owns.append((walls[-1] * workers - sum(TEST_TIMES[n0:])) / 8)
        wall = statistics.median(walls)
        budget = 8 * single_med / workers
        group[str(workers)] = {"wall_s": round(wall, 3), "per_rollout_s": round(wall / 8, 3),
                               "target_s": round(1.5 * budget, 3), "ratio_to_8_singles": round(wall / budget, 3),
                               "sandbox_own_time_per_rollout_s": round(statistics.median(owns), 3),
                               "meets_target": wall <= 1.5 * budget}
    result = {
        "instance": inst.instance_id,
        "repeats": args.repeats,
        "host_tests_median_s": round(host_med, 3),
        "sandbox_eval_median_s": round(single_med, 3),
        "sandbox_rollout_median_s": round(statistics.median(single_rollout), 3),
        "overhead_median_s": round(single_med - host_med, 3),
        # everything but the test command: repo copy, patch, restore, container start/stop, parse, grade
        "sandbox_own_time_median_s": round(statistics.median(own), 3),
        "tests_in_container_median_s": round(statistics.median(TEST_TIMES[1 : 1 + args.repeats]), 3),
        "load_average_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
        "overhead_target_s": 0.5,
        "overhead_meets_target": single_med - host_med <= 0.5,
        "group_of_8": group,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    from rich.console import Console
    from rich.table import Table

    t = Table("measure", "value", "target", title=f"sandbox benchmark — {inst.instance_id}")
    t.add_row("tests on the host (median)", f"{host_med:.3f} s", "")
    t.add_row("one evaluation in the sandbox (median)", f"{single_med:.3f} s", "")
    t.add_row("overhead (median)", f"{single_med - host_med:.3f} s", "≤ 0.5 s")
    t.add_row("  of which the sandbox's own steps", f"{result['sandbox_own_time_median_s']:.3f} s", "")
    t.add_row("  tests inside the container", f"{result['tests_in_container_median_s']:.3f} s", "")
    t.add_row("load average (1 min) before/after", " / ".join(map(str, result["load_average_1m"])), "")
    for w, g in group.items():
        t.add_row(f"group of 8, {w} worker(s)", f"{g['wall_s']:.2f} s ({g['ratio_to_8_singles']:.2f}× 8 singles/{w})",
                  f"≤ {g['target_s']:.2f} s")
        t.add_row("  sandbox's own time per rollout", f"{g['sandbox_own_time_per_rollout_s']:.3f} s", "")
    Console().print(t)
    print(f"wrote {args.out}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
