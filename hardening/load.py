"""Load: N evaluations of the bundled Python tasks' rollouts with workers = cores, then the same with 1 worker.

Checks: no containers, volumes or temp dirs left; the `gagar` process's memory stays flat (RSS sampled every
0.5 s, peak from wait4); every result identical to the 1-worker run (status, verdict, per-test outcome).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hardening.harness import ROOT, containers_of, gagar_eval

COMPARED = ("status", "resolved", "tampered_tests", "patch_successfully_applied", "exit_code")
# RSS growth allowed from the first half of the run to the second (allocator noise, lazily imported modules).
FLAT_MIB = 25.0


def build_load_inputs(work: Path, n: int) -> tuple[Path, Path, Path]:
    """The bundled tasks (Python ones), their rollouts cycled to `n` predictions with distinct rollout ids."""
    tasks = work / "tasks"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--out", str(tasks)], check=True,
                   capture_output=True)
    insts = [json.loads(x) for x in (tasks / "instances.jsonl").read_text().splitlines() if x.strip()]
    py = {i["instance_id"] for i in insts if i.get("language") == "python"}
    base = [json.loads(x) for x in (tasks / "predictions.jsonl").read_text().splitlines() if x.strip()]
    base = [p for p in base if p["instance_id"] in py]
    preds = []
    for k in range(n):
        p = dict(base[k % len(base)])
        p["rollout_id"] = f"{p['rollout_id']}~{k // len(base)}"
        preds.append(p)
    pp = work / "load-predictions.jsonl"
    pp.write_text("".join(json.dumps(p) + "\n" for p in preds))
    return tasks / "instances.jsonl", pp, tasks / "repos"


def _volumes() -> set[str]:
    out = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True)
    return set(out.stdout.split())


def _key(r: dict) -> tuple[str, str]:
    return (r["instance_id"], str(r["rollout_id"]))


def _view(r: dict) -> dict:
    v = {k: r.get(k) for k in COMPARED}
    ts = r.get("tests_status") or {}
    v["tests"] = {part: {k: sorted(ts.get(part, {}).get(k, [])) for k in ("success", "failure")}
                  for part in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    return v


def run_load(work: Path, n: int, *, workers: int | None = None, compare: bool = True, timeout: float = 120) -> dict:
    work = Path(work)
    workers = workers or os.cpu_count() or 1
    inst, preds, repos = build_load_inputs(work, n)
    problems: list[str] = []
    vols_before = _volumes()
    samples: list[tuple[float, float]] = []
    tmp = work / "tmp"
    many = gagar_eval(inst, preds, repos, f"load-{os.getpid()}", work / "out", workers=workers, timeout=timeout,
                      memory="1g", tmpdir=tmp, sample_rss=samples)
    figures: dict = {"evaluations": n, "workers": workers, "wall_s": round(many.wall_s, 1),
                     "evals_per_min": round(n / many.wall_s * 60, 1) if many.wall_s else None,
                     "peak_rss_mb": round(many.peak_rss_mb, 1)}
    if many.rc != 0:
        problems.append(f"{workers}-worker run exited {many.rc}: {many.stderr[-1000:]}")
    if len(many.results) != n or len({_key(r) for r in many.results}) != n:
        problems.append(f"{workers}-worker run: {len(many.results)} result lines for {n} predictions")
    infra = [r for r in many.results if r["status"] == "infra_error"]
    if infra:
        problems.append(f"{len(infra)} infra_error results under load, e.g. {infra[0].get('error')}")
    rss = [m for _, m in samples]
    if len(rss) >= 8:
        half = len(rss) // 2
        first, second = max(rss[:half]), max(rss[half:])
        figures.update(rss_first_half_mb=round(first, 1), rss_second_half_mb=round(second, 1),
                       rss_samples=len(rss))
        if second > first + FLAT_MIB:
            problems.append(f"memory grew under load: peak {first:.0f} MiB in the first half, {second:.0f} MiB "
                            f"in the second")
    runs = [f"load-{os.getpid()}"]
    if compare:
        one = gagar_eval(inst, preds, repos, f"load1-{os.getpid()}", work / "out", workers=1, timeout=timeout,
                         memory="1g", tmpdir=tmp)
        runs.append(f"load1-{os.getpid()}")
        figures["one_worker_wall_s"] = round(one.wall_s, 1)
        a = {_key(r): _view(r) for r in many.results}
        b = {_key(r): _view(r) for r in one.results}
        diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        figures["differences_vs_1_worker"] = len(diff)
        if diff:
            problems.append(f"{len(diff)} results differ from the 1-worker run, e.g. {diff[0]}: "
                            f"{a.get(diff[0])} vs {b.get(diff[0])}")
    figures["statuses"] = _counts(many.results)
    leaked = [c for r in runs for c in containers_of(r)]
    new_vols = sorted(_volumes() - vols_before)
    left_tmp = sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []
    figures.update(leaked_containers=len(leaked), leaked_volumes=len(new_vols), leaked_temp_dirs=len(left_tmp),
                   lost_results=n - len(many.results))
    if leaked:
        problems.append(f"containers left: {leaked[:5]}")
    if new_vols:
        problems.append(f"volumes appeared during the run: {new_vols[:5]}")
    if left_tmp:
        problems.append(f"temp dirs left: {left_tmp[:5]}")
    return {"problems": problems, **figures}


def _counts(results: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return dict(sorted(out.items()))
