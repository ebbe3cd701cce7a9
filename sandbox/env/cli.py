"""`gagar image build --instances`, `gagar image ls`, `gagar image prune`: environment images from the CLI.

Exit codes as everywhere: 0 done, 1 some image failed to build, 2 bad usage or bad input (unreadable files, an
env spec with unknown keys, a `packages` file missing at the commit, a toolchain no base offers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gagar.args import ArgumentParser


def _err(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


def handles(argv: list[str]) -> bool:
    """Which `gagar image` calls are ours: ls/prune, and build with --instances."""
    return bool(argv) and (argv[0] in ("ls", "prune") or (argv[0] == "build" and any(
        a == "--instances" or a.startswith("--instances=") for a in argv)))


def load_for_env(instances: list[Path], env_specs: str | None, prog: str) -> tuple[list, dict | None]:
    """Instances from every file, and the spec map; raises SystemExit(2) with a message on bad input."""
    from sandbox.env.spec import SpecError, load_spec_file
    from sandbox.inputs import InputError, load_instances

    notes: list[str] = []
    out: dict = {}
    try:
        specs = load_spec_file(env_specs) if env_specs else None
        for f in instances:
            if not f.is_file():
                raise InputError(f"--instances {f}: no such file")
            for iid, inst in load_instances(f, notes).items():
                out.setdefault(iid, inst)
    except (InputError, SpecError) as exc:
        raise SystemExit(_err(prog, str(exc))) from exc
    for n in notes:
        print(f"{prog}: warning: {n}", file=sys.stderr)
    return list(out.values()), specs


def _require_runnable(insts: list, specs: dict | None, prog: str) -> None:
    """Instances that could never be evaluated get no image: the checks of `gagar eval`, after the specs."""
    from sandbox.env.spec import apply_specs
    from sandbox.inputs import InputError, require_runnable

    for n in apply_specs({i.instance_id: i for i in insts}, specs):
        print(f"{prog}: warning: {n}", file=sys.stderr)
    try:
        require_runnable(insts)
    except InputError as exc:
        raise SystemExit(_err(prog, str(exc))) from exc


def _plans(insts: list, repos_dir: Path, specs: dict | None, prog: str, strict: bool) -> dict:
    """instance id → EnvTarget; with `strict`, any planning error is bad input (exit 2, all errors listed)."""
    from sandbox.env.images import ImageError
    from sandbox.env.plan import EnvInputError, plan_instance

    out, errors = {}, []
    for inst in insts:
        try:
            out[inst.instance_id] = plan_instance(inst, repos_dir, specs)
        except (EnvInputError, ImageError) as exc:
            errors.append(str(exc))
    if errors and strict:
        raise SystemExit(_err(prog, "\n  ".join(["bad input:", *errors])))
    for e in errors:
        print(f"{prog}: warning: {e}", file=sys.stderr)
    return out


def _common(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--instances", type=Path, nargs="+", required=required, help="instance files (JSONL/JSON)")
    p.add_argument("--repos-dir", type=Path, help="dir holding <owner>__<name> git clones")
    p.add_argument("--env-specs", help="JSON {repo: {version: spec}} for instances without `env`, or `swebench`")


def image_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar image", description="Environment images.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the environment images the instances need (once per spec)")
    _common(b, True)
    b.add_argument("--max-workers", type=int, default=1, help="images built at once (default 1)")
    b.add_argument("--log-dir", type=Path, help="build logs (default ~/.cache/gagar/env-builds)")
    ls = sub.add_parser("ls", help="gagar images: size and what uses them")
    _common(ls, False)
    ls.add_argument("--json", action="store_true", help="one JSON object per image instead of a table")
    pr = sub.add_parser("prune", help="remove environment images no given instance file needs")
    _common(pr, True)
    pr.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    args = p.parse_args(argv)
    prog = f"gagar image {args.cmd}"
    if args.instances and (args.repos_dir is None or not args.repos_dir.is_dir()):
        return _err(prog, f"--repos-dir {args.repos_dir}: not a directory (needed with --instances)")
    try:
        insts, specs = load_for_env(args.instances or [], args.env_specs, prog)
        if args.cmd == "build":
            _require_runnable(insts, specs, prog)
        targets = _plans(insts, args.repos_dir, specs, prog, strict=args.cmd == "build") if insts else {}
    except SystemExit as exc:
        return int(exc.code or 2)
    from sandbox.env.images import ImageError, _client

    try:
        client = _client()
    except ImageError as exc:
        return _err(prog, str(exc))
    if args.cmd == "build":
        return _build(targets, client, args)
    if args.cmd == "ls":
        return _ls(targets, client, args.json)
    return _prune(targets, client, args.dry_run)


def _build(targets: dict, client, args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from sandbox.env.image import build_env_image, ensure_base
    from sandbox.env.images import ImageError

    if args.max_workers < 1:
        return _err("gagar image build", "--max-workers must be at least 1")
    plans = {t.plan.hash: t.plan for t in targets.values() if t.plan}
    print(f"{len(targets)} instance(s): {len(plans)} environment image(s), "
          f"{len(targets) - sum(1 for t in targets.values() if t.plan)} on a base image", file=sys.stderr)
    errors = []
    for base in sorted({t.base for t in targets.values() if t.base and not t.plan}):
        try:
            ensure_base(base, client, print)
        except ImageError as exc:
            errors.append(str(exc))

    def one(plan) -> str | None:
        try:
            ref, built = build_env_image(plan, client=client, log_dir=args.log_dir, say=print)
            if not built:
                print(f"env image {ref}: up to date")
            return None
        except ImageError as exc:
            return str(exc)

    with ThreadPoolExecutor(args.max_workers) as pool:
        errors += [e for e in pool.map(one, plans.values()) if e]
    for e in errors:
        print(f"gagar image build: {e}", file=sys.stderr)
    return 1 if errors else 0


def _rows(client, targets: dict) -> list[dict]:
    users: dict[str, list[str]] = {}
    for iid, t in targets.items():
        users.setdefault(t.image.split(":", 1)[0] if t.plan is None else t.image, []).append(iid)
    rows = []
    for img in client.images.list(filters={"label": "gagar.image"}) + client.images.list(
            filters={"label": "gagar.env"}):
        labels = img.labels or {}
        ref = next((t for t in img.tags if not t.endswith(":latest")), img.tags[0] if img.tags else img.short_id)
        kind = "env" if "gagar.env" in labels else "base"
        used = users.get(ref, []) if kind == "env" else users.get(labels.get("gagar.image", ""), [])
        rows.append({"image": ref, "kind": kind, "size_mb": round(img.attrs.get("Size", 0) / 1e6),
                     "created": img.attrs.get("Created", "")[:19], "id": img.id,
                     "for": labels.get("gagar.env.repo", "") + ("@" + labels["gagar.env.commit"][:10]
                                                                if "gagar.env.commit" in labels else ""),
                     "used_by": used})
    uniq = {r["id"] + r["image"]: r for r in rows}
    return sorted(uniq.values(), key=lambda r: (r["kind"], r["image"]))


def _ls(targets: dict, client, as_json: bool) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    if as_json:
        for r in _rows(client, targets):
            print(json.dumps(r))
        return 0
    t = Table("image", "kind", "size MB", "created", "built for", "used by")
    for r in _rows(client, targets):
        used = (f"{len(r['used_by'])}: " + ", ".join(r["used_by"][:3]) + (" …" if len(r["used_by"]) > 3 else "")
                if r["used_by"] else ("-" if targets else ""))
        t.add_row(r["image"], r["kind"], str(r["size_mb"]), r["created"], r["for"], used)
    Console().print(t)
    return 0


def _prune(targets: dict, client, dry_run: bool) -> int:
    import docker.errors

    needed = {t.plan.hash for t in targets.values() if t.plan}
    gone, kept = [], 0
    for img in client.images.list(filters={"label": "gagar.env"}):
        if img.labels.get("gagar.env") in needed:
            kept += 1
            continue
        for tag in img.tags or [img.id]:
            if not dry_run:
                try:
                    client.images.remove(tag, noprune=False)
                except docker.errors.APIError as exc:
                    print(f"gagar image prune: cannot remove {tag}: {exc.explanation}", file=sys.stderr)
                    continue
            gone.append(tag)
    print(f"{'would remove' if dry_run else 'removed'} {len(gone)} environment image(s), kept {kept}"
          + (": " + ", ".join(gone) if gone else ""))
    return 0
