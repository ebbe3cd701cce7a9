#!/usr/bin/env python3
"""Environment-image benchmark (not a timed test): build time and size per bundled spec, the cache-hit time of
a second run, and the evaluation overhead inside an environment image against the plain base image.

    .venv/bin/python bench/environments.py [--repeats 7] [--no-rebuild]

Builds the env tasks (examples/env_tasks) into a temp dir; removes and rebuilds the bundled specs' env images
(and the shared python3-venv layer) so the build is measured cold (`--no-rebuild` keeps existing ones and only
times what is missing); then evaluates the same gold patch of the dependency-free `acme/retrykit` task in its
base image and in an env image made for it (same tests, same container limits), interleaved, `--repeats` times.
Writes bench/results/environments.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.env.image import build_env_image, find_env_image, prepare_images  # noqa: E402
from sandbox.env.plan import plan_instance  # noqa: E402
from sandbox.env.spec import load_spec_file  # noqa: E402
from sandbox.records import Instance, Prediction  # noqa: E402
from sandbox.run import evaluate_predictions  # noqa: E402

ENV_TASKS = ROOT / "examples" / "env_tasks"


def _size(client: docker.DockerClient, ref: str) -> int:
    return int(client.images.get(ref).attrs.get("Size", 0))


def _parent_ref(client: docker.DockerClient, ref: str) -> str:
    return client.images.get(ref).labels.get("gagar.env.base", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-rebuild", action="store_true")
    args = ap.parse_args()
    client = docker.from_env(timeout=1800)
    work = Path(tempfile.mkdtemp(prefix="gagar-bench-env-"))
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--tasks-dir", str(ENV_TASKS),
                    "--out", str(work / "tasks")], check=True, capture_output=True)
    repos = work / "tasks" / "repos"
    rows = {json.loads(ln)["instance_id"]: Instance.from_dict(json.loads(ln))
            for ln in (work / "tasks" / "instances.jsonl").read_text().splitlines() if ln.strip()}
    specs = load_spec_file(ENV_TASKS / "env_specs.json")
    plans = {iid: t.plan for iid, inst in rows.items() if (t := plan_instance(inst, repos, specs)).plan}
    out: dict = {"machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                             "load_1min": round(__import__("os").getloadavg()[0], 2)}, "specs": {}}
    if not args.no_rebuild:
        for plan in plans.values():
            if find_env_image(client, plan) is not None:
                client.images.remove(plan.ref)
        envbase = {_parent_ref(client, r.tags[0]) for r in client.images.list(filters={"label": "gagar.env"})}
        if not any(envbase):  # nothing else layered on the venv layer: rebuild it too, to time it
            for img in client.images.list(filters={"label": "gagar.envbase"}):
                for tag in img.tags:
                    client.images.remove(tag)
    for iid, plan in plans.items():
        msgs: list[str] = []
        t0 = time.monotonic()
        ref, built = build_env_image(plan, client=client, log_dir=work / "logs", say=msgs.append)
        dt = time.monotonic() - t0
        base = _parent_ref(client, ref)
        out["specs"][plan.repo] = {
            "instance": iid, "spec": plan.spec.to_dict(), "image": ref, "built": built,
            "build_s": round(dt, 1), "steps": msgs,
            "image_mb": round(_size(client, ref) / 1e6), "layer_mb": round((_size(client, ref) - _size(client, base)) / 1e6),
            "parent": base, "parent_mb": round(_size(client, base) / 1e6)}
        print(f"{plan.repo}: {'built' if built else 'found'} in {dt:.1f} s, layer {out['specs'][plan.repo]['layer_mb']} MB")
    # Cache hit: what a second `gagar eval` spends finding the images (planning + lookup, nothing built).
    t0 = time.monotonic()
    _, errors, _ = prepare_images(list(rows.values()), repos_dir=repos, specs=specs, say=lambda m: None)
    out["cache_hit_s"] = round(time.monotonic() - t0, 3)
    assert not errors, errors
    print(f"cache hit (plan + find {len(rows)} instances): {out['cache_hit_s']} s")
    # Overhead: one dependency-free task in its base image vs in an env image built for it.
    flaky = rows["acme__retrykit-5"]
    env_inst = Instance.from_dict({**flaky.to_dict(), "env": {"python": "3.11", "pip_packages": ["six==1.16.0"]}})
    t0 = time.monotonic()
    ref, built = build_env_image(plan_instance(env_inst, repos).plan, client=client, log_dir=work / "logs",
                                 say=lambda m: None)
    out["overhead_env_image"] = {"image": ref, "build_s": round(time.monotonic() - t0, 1)}
    times: dict[str, list[float]] = {"base": [], "env": []}
    for k in range(args.repeats):
        for kind, inst in (("base", flaky), ("env", env_inst)) if k % 2 == 0 else (("env", env_inst), ("base", flaky)):
            cfg = SandboxConfig(repos_dir=repos, run_id=f"bench-env-{kind}-{k}")
            [r] = evaluate_predictions({inst.instance_id: inst}, [Prediction(inst.instance_id, inst.patch, "b", "g")],
                                       cfg)
            assert r.status in ("resolved", "unresolved"), (r.status, r.error)
            times[kind].append(r.duration_s)
    med = {k: statistics.median(v) for k, v in times.items()}
    out["eval_s"] = {"base_median": round(med["base"], 3), "env_median": round(med["env"], 3),
                     "env_minus_base": round(med["env"] - med["base"], 3), "repeats": args.repeats,
                     "base_all": times["base"], "env_all": times["env"]}
    print(f"evaluation, median of {args.repeats}: base {med['base']:.3f} s, env {med['env']:.3f} s "
          f"(+{med['env'] - med['base']:.3f} s)")
    client.images.remove(ref)
    res = ROOT / "bench" / "results" / "environments.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {res}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
