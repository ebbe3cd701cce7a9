#!/usr/bin/env python3
"""Environment-image benchmark (not a timed test): build time and size per bundled spec, the cache-hit time of
a second run, and the evaluation overhead inside an environment image against the plain base image.

    .venv/bin/python bench/environments.py [--repeats 7] [--no-rebuild]
    .venv/bin/python bench/environments.py --swebench-table [--specs bench/data/swebench-4.1.0-specs.json]

Builds the env tasks (examples/env_tasks) into a temp dir; removes and rebuilds the bundled specs' env images
(and the shared python3-venv layer) so the build is measured cold (`--no-rebuild` keeps existing ones and only
times what is missing); then evaluates the same gold patch of the dependency-free `acme/retrykit` task in its
base image and in an env image made for it (same tests, same container limits), interleaved, `--repeats` times.
Writes bench/results/environments.json.

`--swebench-table` (no Docker): for every SWE-bench (repo, version) spec, whether gagar can build its environment
offline — from PyPI and Debian only, no conda — and run its tests: the counts by outcome and the reason for each
spec that cannot, into the same file (key `swebench_specs`); `bench/swebench_rows.py` adds the real runs.
"""

from __future__ import annotations

import argparse
import json
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


RESULTS = ROOT / "bench" / "results" / "environments.json"
_OTHER_LANG = re.compile(r"(node|go|java|jdk|rust|ruby|php|gcc|cmake|dotnet)_?version", re.I)
_COMPILES = re.compile(r"--no-build-isolation|build_ext|\bcython\b|\bmake\b", re.I)


def swebench_table(spec_file: Path) -> dict:
    """Per (repo, version): `ok` (pip/apt build, offered Python, supported runner) or why not; notes on what is
    approximated (conda steps dropped, conda packages via pip, an install that compiles extensions)."""
    from sandbox.env.spec import _from_swebench
    from sandbox.env.swebench import UNSUPPORTED_RUNNERS, framework_of
    from sandbox.env.toolchains import PYTHON_BASES

    raw = json.loads(spec_file.read_text())
    rows: dict[str, dict] = {}
    for repo, versions in sorted(raw.items()):
        for version, d in sorted(versions.items()):
            spec = _from_swebench(d, f"{repo} {version}")
            cmd = (spec.run.test_cmd[-1] if spec.run else "") or ""
            notes = [x.removeprefix("lost: ") for x in spec.ignored if x.startswith("lost: ")]
            if spec.packages == "environment.yml" or spec.conda_packages:
                notes.append("conda packages installed with pip (conda-only ones are named and left out)")
            if _COMPILES.search(" ".join([*spec.install, *spec.conda_packages, *spec.pip_packages])):
                notes.append("its install compiles extensions: needs a compiler the base image lacks "
                             "(add apt_packages: build-essential)")
            langs = _OTHER_LANG.findall(json.dumps(d.get("docker_specs") or {}))
            if not spec.python:
                status = f"not a Python spec ({', '.join(sorted({x.lower() for x in langs})) or 'no python'}): " \
                         "SWE-bench Multilingual's runners and build steps are not supported"
            elif ".".join(spec.python.split(".")[:2]) not in PYTHON_BASES:
                status = f"python {spec.python} not offered (offered: {', '.join(PYTHON_BASES)})"
            elif not cmd:
                status = "the spec has no test_cmd (SWE-bench runs none for it)"
            elif framework_of(cmd) is None:
                why = next((w for r, w in UNSUPPORTED_RUNNERS.items() if re.search(rf"(^|\s){r}\b", cmd)),
                           "runner not recognised")
                status = f"test command `{cmd}` not supported: {why}"
            else:
                status = "ok"
            rows[f"{repo} {version}"] = {"status": status, "python": spec.python, "runner": framework_of(cmd),
                                         "notes": notes}
    counts: dict[str, int] = {}
    for r in rows.values():
        key = r["status"] if r["status"] == "ok" else r["status"].split(":")[0].split(" (")[0]
        key = re.sub(r"python \S+ not offered", "python version not offered", key)
        key = re.sub(r"test command `.*` not supported", "test runner not supported", key)
        key = re.sub(r"the spec has no test_cmd.*", "no test_cmd in the spec", key)
        counts[key] = counts.get(key, 0) + 1
    python_rows = {k: v for k, v in rows.items() if v["python"]}
    by_repo: dict[str, dict[str, int]] = {}
    for k, v in python_rows.items():
        c = by_repo.setdefault(k.split(" ")[0], {"ok": 0, "not": 0})
        c["ok" if v["status"] == "ok" else "not"] += 1
    return {"spec_file": str(spec_file.relative_to(ROOT)), "specs": len(rows), "counts": counts,
            "python_specs": len(python_rows), "python_ok": sum(v["status"] == "ok" for v in python_rows.values()),
            "python_ok_clean": sum(v["status"] == "ok" and not v["notes"] for v in python_rows.values()),
            "by_repo": by_repo, "per_spec": rows}


def _save(key_values: dict) -> None:
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.update(key_values)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-rebuild", action="store_true")
    ap.add_argument("--swebench-table", action="store_true", help="only the per-spec SWE-bench table (no Docker)")
    ap.add_argument("--specs", type=Path, default=ROOT / "bench" / "data" / "swebench-4.1.0-specs.json")
    args = ap.parse_args()
    if args.swebench_table:
        table = swebench_table(args.specs.resolve())
        _save({"swebench_specs": table})
        print(json.dumps({k: table[k] for k in ("specs", "counts", "python_specs", "python_ok", "python_ok_clean",
                                                 "by_repo")}, indent=1))
        return 0
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
    _save(out)  # the SWE-bench keys other runs wrote stay
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
