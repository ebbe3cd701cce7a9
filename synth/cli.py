"""`gagar tasks synth`: validated bug-fix tasks from real Python projects (docs/synth.md).

    gagar tasks synth (--repo DIR | --sdist NAME==VERSION | --sources FILE)... --out DIR [--max-tasks N]
                      [--seed S] [--max-workers N] [--env-specs FILE] [...]

Writes DIR/instances.jsonl (SWE-bench instances), DIR/repos/<owner>__<name> (for `gagar eval --repos-dir
DIR/repos`), DIR/splits.json, DIR/manifest.json (sources with sha256, settings, yields: `--sources
DIR/manifest.json` reproduces the set) and DIR/tasks_meta.jsonl (each task's bug kind and place: kept out of the
instances, which must not reveal the bug). Exit 0 when the run made tasks (projects that gave none are listed
with the reason), 1 when it made none (every source skipped), 2 on bad input, 130 when interrupted (a re-run
resumes).

    gagar tasks repos SET --out DIR

Rebuilds the task repositories of a set (SET/manifest.json, instances.jsonl, tasks_meta.jsonl) into DIR/repos
without running a test, checking every commit and patch against the set (exit 1 on a difference).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gagar.args import ArgumentParser
from synth.mutate import KINDS


def _err(msg: str, cmd: str = "synth") -> int:
    print(f"gagar tasks {cmd}: error: {msg}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gagar tasks", description="task sets for training and evaluation")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="synthesize validated bug-fix tasks from Python projects (SWE-smith style)",
                       description=__doc__.split("\n\n")[0])
    s.add_argument("--sdist", action="append", default=[], metavar="NAME==VERSION", help="a PyPI sdist (repeatable)")
    s.add_argument("--repo", action="append", default=[], metavar="DIR", help="a local git repository (repeatable)")
    s.add_argument("--sources", type=Path, help="JSON: a list of sources, or {sources: [...], settings} (a manifest)")
    s.add_argument("--out", type=Path, required=True, help="output directory (a re-run resumes in it)")
    s.add_argument("--env-specs", help="JSON {repo: {version: spec}} for sources without `env` (as in gagar eval)")
    s.add_argument("--tests", action="append", default=[], metavar="PATH",
                   help="test paths for --sdist/--repo sources (default: what pytest finds)")
    s.add_argument("--pytest-arg", action="append", default=[], metavar="ARG", help="extra pytest argument")
    s.add_argument("--max-tasks", type=int, help="tasks per project (default 50)")
    s.add_argument("--seed", type=int, help="candidate order (default 0)")
    s.add_argument("--max-workers", type=int, default=2, help="containers at once (default 2)")
    s.add_argument("--max-fail", type=int, help="most tests a bug may break (K, default 50)")
    s.add_argument("--repeats", type=int, help="runs of each kept bug and of the clean tree (default 3)")
    s.add_argument("--per-function", type=int, help="candidates per function (default 3)")
    s.add_argument("--kinds", help=f"comma-separated bug kinds (default all: {','.join(KINDS)})")
    s.add_argument("--heldout", type=float, help="share of repositories held out (default 0.25)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds per test run at most (default 300; a "
                   "function's runs get at most 5 x --cpu-limit)")
    s.add_argument("--cpu-limit", type=int, help="CPU seconds per test process in a task's command (default 30; "
                   "recorded in the manifest)")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    r = sub.add_parser("repos", help="rebuild a synthesized set's task repositories (no tests run)",
                       description="Rebuild the task repositories of a set made by `gagar tasks synth` (its "
                       "manifest.json, instances.jsonl and tasks_meta.jsonl) into OUT/repos, checking every commit "
                       "and patch against the set.")
    r.add_argument("set", type=Path, help="the set's directory (e.g. examples/synth)")
    r.add_argument("--out", type=Path, required=True, help="output directory: OUT/repos is gagar eval's --repos-dir")
    return p


def _repos(args: argparse.Namespace) -> int:
    from synth.rebuild import rebuild
    from synth.sources import SourceError

    try:
        args.out.mkdir(parents=True, exist_ok=True)
        done = rebuild(args.set, args.out.resolve())
    except ValueError as exc:
        return _err(str(exc), "repos")
    except (SourceError, OSError) as exc:  # a download or git failure, not the input
        print(f"gagar tasks repos: {exc}", file=sys.stderr)
        return 1
    for repo, n in done.tasks.items():
        print(f"{repo}: {n} task commits", file=sys.stderr)
    for line in done.mismatches[:20]:
        print(f"mismatch: {line}", file=sys.stderr)
    total = sum(done.tasks.values())
    print(f"{total} tasks in {len(done.tasks)} repositories → {args.out / 'repos'}"
          + (f"; {len(done.mismatches)} differ from the set" if done.mismatches else "; all as in the set"),
          file=sys.stderr)
    return 1 if done.mismatches else 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "repos":
        return _repos(args)
    from synth.factory import Options, synthesize
    from synth.sources import Source
    from synth.validate import CPU_LIMIT_S

    settings: dict = {}
    sources: list[Source] = []
    try:
        if args.sources is not None:
            try:
                data = json.loads(args.sources.read_text(encoding="utf-8"))
            except OSError as exc:
                return _err(f"--sources {args.sources}: cannot read it ({exc.strerror or exc})")
            except ValueError as exc:
                return _err(f"--sources {args.sources}: not valid JSON ({exc})")
            rows = data.get("sources") if isinstance(data, dict) else data
            if not isinstance(rows, list):
                return _err(f"--sources {args.sources}: expected a list of sources or an object with `sources`")
            if isinstance(data, dict):
                settings = {k: data[k] for k in ("seed", "max_tasks", "max_fail", "repeats", "per_function",
                                                 "kinds", "heldout", "cpu_limit") if k in data}
            sources += [Source.from_dict(r, f"--sources {args.sources} [{i}]") for i, r in enumerate(rows)]
        for spec in args.sdist:
            sources.append(Source.from_dict({"sdist": spec, "tests": args.tests, "pytest_args": args.pytest_arg},
                                            f"--sdist {spec}"))
        for path in args.repo:
            if not Path(path).is_dir():
                return _err(f"--repo {path}: not a directory")
            sources.append(Source.from_dict({"path": str(Path(path).resolve()), "tests": args.tests,
                                             "pytest_args": args.pytest_arg}, f"--repo {path}"))
    except ValueError as exc:
        return _err(str(exc))
    if not sources:
        return _err("give at least one --sdist NAME==VERSION, --repo DIR or --sources FILE")
    repos = [s.repo_name() for s in sources]
    dupes = sorted({r for r in repos if repos.count(r) > 1})
    if dupes:
        return _err(f"two sources make the same repository {dupes[0]}: give one of them `repo`")
    for flag in ("seed", "max_tasks", "max_fail", "repeats", "per_function", "kinds", "heldout", "cpu_limit"):
        v = getattr(args, flag)
        if v is not None:
            settings[flag] = v
    kinds = settings.get("kinds", KINDS)
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        return _err(f"unknown bug kind(s) {', '.join(bad) or '(none given)'}; known: {', '.join(KINDS)}")
    try:
        opts = Options(out=args.out.resolve(), seed=int(settings.get("seed", 0)),
                       max_tasks=int(settings.get("max_tasks", 50)), max_fail=int(settings.get("max_fail", 50)),
                       repeats=int(settings.get("repeats", 3)), per_function=int(settings.get("per_function", 3)),
                       kinds=tuple(kinds), max_workers=args.max_workers, timeout=args.timeout,
                       heldout=float(settings.get("heldout", 0.25)), progress=not args.quiet,
                       cpu_limit=int(settings.get("cpu_limit", CPU_LIMIT_S)))
    except (TypeError, ValueError) as exc:
        return _err(f"bad setting: {exc}")
    for name, v, lo in (("--max-tasks", opts.max_tasks, 1), ("--max-fail", opts.max_fail, 1),
                        ("--repeats", opts.repeats, 1), ("--per-function", opts.per_function, 1),
                        ("--max-workers", opts.max_workers, 1), ("--cpu-limit", opts.cpu_limit, 1)):
        if v < lo:
            return _err(f"{name} must be at least {lo}")
    if not 0 <= opts.heldout < 1:
        return _err("--heldout must be in [0, 1)")
    if args.env_specs:
        from sandbox.env.spec import SpecError, load_spec_file

        try:
            opts.env_specs = load_spec_file(args.env_specs)
        except SpecError as exc:
            return _err(str(exc))
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _err(f"--out {args.out}: {exc.strerror or exc}")
    manifest = synthesize(sources, opts)
    t = manifest["totals"]
    skipped = [s for s in manifest["sources"] if s["status"] != "ok"]
    for s in manifest["sources"]:
        if s["status"] == "ok":
            print(f"{s['repo']}: {s['stats'].get('tasks', 0)} tasks", file=sys.stderr)
        elif args.quiet:  # otherwise the progress lines said why, once, when it happened
            print(f"{s['repo']}: skipped — {s['reason']}", file=sys.stderr)
    if skipped and not args.quiet:
        print(f"skipped (reasons above and in manifest.json): {', '.join(s['repo'] for s in skipped)}",
              file=sys.stderr)
    print(f"{t['tasks']} tasks from {t['projects_ok']} projects ({t['projects_skipped']} skipped) in "
          f"{t['wall_s']:.0f} s → {opts.out / 'instances.jsonl'}", file=sys.stderr)
    if not t["tasks"]:
        why = "every source was skipped" if len(skipped) == len(sources) else "no project gave a valid task"
        print(f"gagar tasks synth: no task was made: {why} (the reasons are above and in manifest.json)",
              file=sys.stderr)
        return 1
    return 0
