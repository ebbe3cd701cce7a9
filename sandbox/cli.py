"""`gagar eval`, `gagar image`, `gagar sandbox`: argument parsing only; the work is in run/images/container."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from gagar.args import ArgumentParser

if TYPE_CHECKING:
    from sandbox.config import SandboxConfig


def _err(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------------- image
def image_main(argv: list[str]) -> int:
    from sandbox.env import cli as envcli
    from sandbox.env import images, toolchains

    if envcli.handles(argv):  # environment images: build --instances, ls, prune
        return envcli.image_main(argv)

    p = ArgumentParser(prog="gagar image", description="Build or list the sandbox base images (offline).")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="debootstrap + docker import; skipped when the recipe's image exists")
    b.add_argument("names", nargs="*", help=f"images to build: {', '.join(toolchains.ALL_RECIPES)}")
    b.add_argument("--all", action="store_true", help=f"build the default images ({', '.join(images.RECIPES)})")
    b.add_argument("--instances", nargs="+", help="build the environment images these instances need "
                   "(with --repos-dir, --env-specs, --max-workers; see docs/environments.md)")
    b.add_argument("--force", action="store_true", help="rebuild even when an image with the recipe hash exists")
    b.add_argument("--mirror", help="Debian mirror URL (default: the one in apt's sources, or $GAGAR_DEBIAN_MIRROR)")
    b.add_argument("--jobs", type=int, default=3, help="images built at once (default 3; mostly download-bound)")
    sub.add_parser("list", help="show each image, its recipe hash and whether it is built")
    sub.add_parser("ls", help="every gagar image (base and environment): size and what uses it")
    sub.add_parser("prune", help="remove environment images no given instance file needs")
    args = p.parse_args(argv)

    if args.cmd == "list":
        try:
            rows = images.list_images()
        except images.ImageError as exc:
            return _err("gagar image", str(exc))
        from rich.console import Console
        from rich.table import Table

        t = Table("image", "recipe", "status", "size MB", "created", "tags")
        for r in rows:
            t.add_row(r["name"], r["recipe"], r["status"], str(r["size_mb"] or ""), r["created"], " ".join(t.split(":", 1)[1] for t in r["tags"]))
        Console().print(t)
        return 0

    names = list(images.RECIPES) if args.all else args.names
    if not names:
        return _err("gagar image build", "name the images to build or pass --all")
    unknown = [n for n in names if n not in toolchains.ALL_RECIPES]
    if unknown:
        return _err("gagar image build",
                    f"unknown image(s) {', '.join(unknown)}; known: {', '.join(toolchains.ALL_RECIPES)}")
    try:
        client = images._client()
    except images.ImageError as exc:
        return _err("gagar image build", str(exc))

    def one(name: str) -> str | None:
        try:
            images.build_image(toolchains.ALL_RECIPES[name], force=args.force, mirror=args.mirror, client=client)
            return None
        except images.ImageError as exc:
            return str(exc)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        errors = [e for e in pool.map(one, names) if e]
    for e in errors:
        print(f"gagar image build: {e}", file=sys.stderr)
    return 1 if errors else 0


# The input loaders live in sandbox.inputs (the trainer, SFT data and the verl recipe use them too).
from sandbox.inputs import InputError, load_instances, load_predictions, require_runnable  # noqa: E402,F401


# -------------------------------------------------------------------------------------------------- eval
def add_sandbox_options(p: ArgumentParser, *, timeout: float, timeout_help: str) -> None:
    """The sandbox's limits and image, for every command that runs containers (`gagar eval`, `gagar grade
    --probe`); `sandbox_config` reads them back."""
    p.add_argument("--max-workers", type=int, default=1, help="containers run at once")
    p.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    p.add_argument("--image", help="run every instance in this image instead of the gagar-* images")
    p.add_argument("--memory", default="2g", help="memory limit per container, no swap")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs per container")
    p.add_argument("--pids-limit", type=int, default=256, help="max processes per container")
    p.add_argument("--output-limit", default="1m", help="test output kept per run (the rest dropped)")
    p.add_argument("--max-patch-bytes", default="1m", help="patches larger than this are rejected")
    p.add_argument("--max-apply-bytes", default="64m", help="what a patch's git binary hunks may inflate to when "
                   "applied; over it the patch is rejected")
    p.add_argument("--max-write", default="2g", help="data the tests may write into the work tree before the "
                   "container is killed (the host's disk has no other quota)")
    p.add_argument("--runtime", help="OCI runtime dockerd starts the containers with, e.g. crun (faster starts; "
                   "scripts/ensure_docker.sh registers it); default: the engine's (runc)")


def sandbox_config(args: argparse.Namespace, repos_dir: Path, run_id: str = "adhoc", *,
                   local: bool = True) -> SandboxConfig | str:
    """The SandboxConfig of `add_sandbox_options`' values, or what is wrong with them in words; `local`: the
    runtime and the image are checked on this machine's engine too."""
    import os

    from sandbox.config import SandboxConfig, parse_size

    if args.max_workers < 1:
        return "--max-workers must be at least 1"
    if args.timeout <= 0:
        return "--timeout must be positive"
    ncpu = os.cpu_count() or 1
    if not 0 < args.cpus <= ncpu:
        return f"--cpus must be in (0, {ncpu}] on this machine"
    try:
        out_limit, max_patch = parse_size(args.output_limit), parse_size(args.max_patch_bytes)
        config = SandboxConfig(repos_dir=repos_dir.resolve(), image=args.image, memory=args.memory,
                               cpus=args.cpus, pids_limit=args.pids_limit, timeout=args.timeout,
                               max_workers=args.max_workers, output_limit_bytes=out_limit,
                               max_patch_bytes=max_patch, max_write_bytes=parse_size(args.max_write),
                               max_apply_bytes=parse_size(args.max_apply_bytes), run_id=run_id, runtime=args.runtime)
        if config.memory_bytes < 6 << 20:
            raise ValueError("--memory must be at least 6m (Docker's minimum)")
    except ValueError as exc:
        return str(exc)
    if args.runtime and local:
        from sandbox.container import runtime_missing

        missing = runtime_missing(args.runtime)
        if missing:
            return missing
    if args.image and local:
        from sandbox.run import image_missing

        missing = image_missing(args.image, override=True)
        if missing:
            return missing
    return config


def eval_main(argv: list[str]) -> int:
    import re

    p = ArgumentParser(prog="gagar eval",
                       description="Evaluate predictions in the Docker sandbox (SWE-bench compatible).")
    p.add_argument("--instances", required=True, type=Path, help="instances (JSONL, JSON list, or dict by id)")
    p.add_argument("--predictions", required=True, type=Path, help="predictions (JSONL, JSON list, or dict by id)")
    p.add_argument("--repos-dir", required=True, type=Path, help="dir holding <owner>__<name> git clones")
    p.add_argument("--run-id", required=True, help="name of this run; results go to REPORT_DIR/RUN_ID/")
    p.add_argument("--report-dir", required=True, type=Path, help="where run directories are written")
    add_sandbox_options(p, timeout=600.0, timeout_help="seconds per test run before the container is killed")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this machine's Docker engine (default); ray: one sandbox actor per node of a Ray "
                   "cluster, --max-workers per node (needs gagar[ray]; see docs/scaling.md)")
    p.add_argument("--ray-address", help="the Ray cluster to use (e.g. HEAD:6379 or auto); without it, --executor "
                   "ray starts a local Ray for this run and shuts it down after")
    p.add_argument("--redo", action="store_true", help="re-evaluate predictions already in results.jsonl")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--env-specs", help="environment specs for instances without `env`: JSON {repo: {version: "
                   "spec}}, or `swebench` (needs the swebench package); see docs/environments.md")
    args = p.parse_args(argv)
    prog = "gagar eval"

    for flag, f in (("--instances", args.instances), ("--predictions", args.predictions)):
        if not f.is_file():
            return _err(prog, f"{flag} {f}: no such file")
    if not args.repos_dir.is_dir():
        return _err(prog, f"--repos-dir {args.repos_dir}: not a directory")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", args.run_id):
        return _err(prog, f"--run-id {args.run_id!r}: use letters, digits, '.', '_' or '-' (no slashes)")
    if args.ray_address and args.executor != "ray":
        return _err(prog, "--ray-address needs --executor ray")
    # on Ray the runtime and the image live on the nodes: each checks its own
    config = sandbox_config(args, args.repos_dir, args.run_id, local=args.executor == "local")
    if isinstance(config, str):
        return _err(prog, config)
    run_dir = args.report_dir / args.run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _err(prog, f"--report-dir {args.report_dir}: cannot create {run_dir} ({exc})")

    notes: list[str] = []
    from sandbox.env.spec import SpecError, load_spec_file

    try:
        env_specs = load_spec_file(args.env_specs) if args.env_specs else None
        instances = load_instances(args.instances, notes)
        predictions = load_predictions(args.predictions, notes)
    except (InputError, SpecError) as exc:
        return _err(prog, str(exc))
    for n in notes:
        print(f"{prog}: warning: {n}", file=sys.stderr)
    if not instances:
        return _err(prog, f"{args.instances}: no instances")
    from sandbox.env.spec import apply_specs

    for n in apply_specs(instances, env_specs):  # spec and SWE-bench test command travel with the instance
        print(f"{prog}: warning: {n}", file=sys.stderr)
    if not predictions:
        return _err(prog, f"{args.predictions}: no predictions to evaluate")
    try:  # after the specs: a spec may give the test_cmd
        require_runnable({pr.instance_id: instances[pr.instance_id] for pr in predictions
                          if pr.instance_id in instances}, args.instances)
    except InputError as exc:
        return _err(prog, str(exc))
    unknown = sorted({pr.instance_id for pr in predictions if pr.instance_id not in instances})
    if unknown:
        print(f"{prog}: warning: {len(unknown)} prediction instance id(s) not in {args.instances}, not evaluated: "
              + ", ".join(unknown[:10]) + (" …" if len(unknown) > 10 else ""), file=sys.stderr)

    from sandbox.executor import RayUnavailable, make_executor

    try:
        with make_executor(args.executor, args.ray_address) as executor:
            results = executor.evaluate(instances, predictions, config, run_dir=run_dir, redo=args.redo,
                                        progress=not args.no_progress, extra_report={"skipped": notes})
    except RayUnavailable as exc:
        return _err(prog, str(exc))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished results are kept in {run_dir}/results.jsonl "
              "(re-run the same command to resume)", file=sys.stderr)
        return 130
    except OSError as exc:  # the report dir vanished or filled up mid-run: say where, no traceback
        print(f"{prog}: error: cannot write the run's files under {run_dir}: {exc}; the containers were "
              "removed; fix the directory and re-run the same command to resume", file=sys.stderr)
        return 1
    _print_summary(run_dir, results)
    return 0


def _print_summary(run_dir: Path, results: list) -> None:
    import json
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    rep = json.loads((run_dir / "report.json").read_text())
    counts = Counter(r.status for r in results)
    t = Table("status", "count", title=f"run {rep['run_id']}: {rep['submitted_instances']} predictions")
    for s, n in sorted(counts.items()):
        t.add_row(s, str(n))
    Console(stderr=True).print(t)
    print(f"results: {run_dir / 'results.jsonl'}\nreport:  {run_dir / 'report.json'}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------- sandbox
def sandbox_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar sandbox", description="Sandbox maintenance.")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gc", help="remove leftover sandbox containers (label gagar.sandbox=1) and the temp "
                       "workspaces of dead runs")
    g.add_argument("--run-id", help="only the containers of this run")
    g.add_argument("--force", action="store_true", help="also the containers of runs whose process is still "
                   "running on this machine (kept by default: those rollouts would end as infra_error)")
    args = p.parse_args(argv)
    import docker.errors

    from sandbox import cleanup
    from sandbox.workspace import remove_tree, stale_workspaces

    try:
        done = cleanup.gc(args.run_id, force=args.force)
    except docker.errors.DockerException as exc:
        return _err("gagar sandbox gc", f"cannot reach the Docker engine ({exc})")
    print(f"removed {len(done.removed)} container(s)" + (": " + ", ".join(done.removed) if done.removed else ""))
    if done.spared:
        print(f"kept {len(done.spared)} container(s) of runs still going (their gagar process is alive; --force "
              f"removes them too): {', '.join(done.spared)}")
    stale = stale_workspaces()
    for d in stale:
        remove_tree(d)
    if stale:
        print(f"removed {len(stale)} workspace(s) left by dead processes: " + ", ".join(d.name for d in stale))
    return 0
