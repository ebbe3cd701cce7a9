"""Mutation pairs for the warm start (SWE-smith's recipe): the task factory's mutation engine (`synth.mutate`)
breaks a function of a training project, and the pair is (the prompt the policy would see for that bug → the
answer that restores the original), in the run's edit format. Correct by construction: no test is run.

Only the training split's projects are mutated. The projects come from the `repos` of the set's `splits.json`;
a project of any other split (the held-out one) is refused — checked here, not assumed — and so is a training
project one of whose tasks is outside the training split. A bug whose key is one of the training tasks' own is
skipped, so the warm start never shows the RL tasks' exact fixes.

The issue text is shaped like a synthesized task's (`synth.statement.problem_statement`): the failing tests are
the project's tests that name the broken function (by reading the test files, not by running them), with no
assertion messages, since nothing was run.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.integrity.gitsafe import source_git
from sandbox.records import Instance
from synth.mutate import find_mutations
from synth.order import Checker, iter_candidates
from synth.statement import problem_statement
from trainer.agent.edits import as_answer, changed_line, find_region, make_diff
from trainer.agent.prompts import _is_test_path, region_messages

MAX_TESTS = 2  # failing tests named in a pair's issue text


@dataclass(frozen=True)
class Project:
    repo: str  # owner/name, as the tasks name it
    path: Path  # its task repository (`gagar tasks repos`)
    commit: str  # the unbroken source: the parent of its tasks' base commits
    task_keys: frozenset[str]  # its training tasks' bug keys (never made into pairs)


def training_projects(instances_path: Path, repos_dir: Path, split: str,
                      instances: dict[str, Instance]) -> list[Project]:
    """The projects of split `split` of the set at `instances_path` (its `splits.json` lists each split's
    repositories), with what is needed to mutate them. Raises ValueError when the split has no project list,
    when a project is also listed in another split, or when one of a listed project's tasks is not in `split`:
    a pair from a held-out project would teach the policy the held-out code."""
    path = instances_path.parent / "splits.json"
    try:
        splits = json.loads(path.read_text())
        repos = splits["repos"]
        ours = list(repos[split])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"mutation pairs need {path} with the repositories of split {split!r} "
                         f"(`gagar tasks synth` writes them): {exc}") from exc
    others = {r for name, rs in repos.items() if name != split for r in rs}
    if clash := sorted(set(ours) & others):
        raise ValueError(f"{path}: {', '.join(clash)} is listed in split {split!r} and in another split; no "
                         "pair is made from a project with held-out tasks")
    in_split = set(splits.get(split) or [])
    meta = _task_meta(instances_path.parent)
    out = []
    for repo in sorted(ours):
        tasks = [i for i in instances.values() if i.repo == repo]
        if not tasks:
            continue
        if outside := sorted(i.instance_id for i in tasks if i.instance_id not in in_split):
            raise ValueError(f"{repo} is a {split} project but its task {outside[0]} is not in that split")
        repo_dir = repos_dir / tasks[0].repo_dirname
        commit = source_git(repo_dir, "rev-parse", f"{tasks[0].base_commit}^").strip()
        keys = frozenset(meta[i.instance_id] for i in tasks if i.instance_id in meta)
        out.append(Project(repo, repo_dir, commit, keys))
    if not out:
        raise ValueError(f"split {split!r} of {path} has no project with tasks in {instances_path}")
    return out


def _task_meta(set_dir: Path) -> dict[str, str]:
    """instance_id -> the bug's key, from the set's `tasks_meta.jsonl` (empty when it has none)."""
    path = set_dir / "tasks_meta.jsonl"
    if not path.is_file():
        return {}
    from sandbox.jsonl import read_jsonl

    return {r["instance_id"]: r["key"] for r in read_jsonl(path) if "key" in r}


NOT_LIBRARY = {"benchmarks", "benchmark", "bench", "examples", "example", "docs", "doc", "scripts", "tools"}


def _files(project: Project) -> dict[str, str]:
    """The project's Python files at its unbroken commit: its library and its tests (not its set-up, docs,
    examples or benchmarks, which no task's bug is in)."""
    tracked = source_git(project.path, "ls-tree", "-r", "--name-only", project.commit).splitlines()
    out = {}
    for path in tracked:
        name = path.rsplit("/", 1)[-1]
        if not path.endswith(".py") or name in ("setup.py", "conftest.py") or NOT_LIBRARY & set(path.split("/")[:-1]):
            continue
        try:
            out[path] = source_git(project.path, "cat-file", "blob", f"{project.commit}:{path}", binary=True).decode()
        except UnicodeDecodeError:
            continue
    return out


def _test_index(files: dict[str, str]) -> dict[str, list[str]]:
    """name -> ids of the test functions (pytest's `path::Class::test`) whose body uses that name."""
    index: dict[str, list[str]] = {}
    for path, text in sorted(files.items()):
        if not _is_test_path(path):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node, prefix in _tests(tree, path):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            for name in names:
                index.setdefault(name, []).append(f"{prefix}::{node.name}")
    return index


def _tests(tree: ast.Module, path: str) -> Iterator[tuple[ast.AST, str]]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node, path
        elif isinstance(node, ast.ClassDef) and "Test" in node.name:  # TestX, XTest, XTests, XTestCase
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                    yield sub, f"{path}::{node.name}"


def _public_names(text: str) -> set[str]:
    """A module's top-level public functions and classes: what its tests call."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith("_")}


def _statement(project: str, function: str, index: dict[str, list[str]], rng: random.Random, patch: str,
               module_names: set[str]) -> str:
    """The issue text: the tests that use the broken function by name, else those that use its module's public
    names (a private helper is tested through them)."""
    # `C.x.setter` / `C.x.deleter` (a property's accessors) and `f@L42` (a name defined twice) are the factory's
    # names for functions that share a Python name: the tests call that name
    parts = [p for p in re.sub(r"@L\d+$", "", function).split(".") if p not in ("<locals>", "setter", "deleter")]
    name = next((p for p in reversed(parts) if not (p.startswith("__") and p.endswith("__"))), parts[-1])
    tests = sorted(set(index.get(name, []))) or sorted({t for n in module_names for t in index.get(n, [])})
    failing = sorted(rng.sample(tests, min(MAX_TESTS, len(tests)))) if tests else []
    return problem_statement(project, failing, {}, patch)


def mutation_pairs(projects: list[Project], *, count: int, seed: int, edit_format: str, max_region_lines: int,
                   max_chars: int, per_function: int = 2) -> list[dict[str, Any]]:
    """`count` pairs (about as many from each project), each a chat record — system, user (the prompt of
    `edit_format`), assistant (the answer that undoes the bug) — with where it came from. Deterministic for a
    seed: the candidates' order is the factory's (`synth.order.iter_candidates`: round robin over bug kinds)."""
    rng = random.Random(seed)
    quota = [count // len(projects) + (k < count % len(projects)) for k in range(len(projects))]
    out: list[dict] = []
    for project, want in zip(projects, quota, strict=True):
        files = _files(project)
        index = _test_index(files)
        sources = {p: t for p, t in files.items() if not _is_test_path(p)}
        muts = [m for p, t in sorted(sources.items()) for m in find_mutations(p, t)]
        name = project.repo.split("/", 1)[-1]
        modules: dict[str, set[str]] = {}
        made = 0
        per_fn: dict[tuple[str, int], int] = {}
        # at most `per_function` pairs per function, a function being its lines (a property's getter and setter
        # share a Python name but are two functions), in the factory's round-robin order
        for m in iter_candidates(muts, seed, Checker(sources), per_function=1 << 30):
            if made >= want:
                break
            fn = (m.path, m.func_lines[0])
            if m.key in project.task_keys or per_fn.get(fn, 0) >= per_function:
                continue
            clean = sources[m.path]
            broken = m.apply(clean)
            fix = make_diff(m.path, broken, clean)
            region = find_region(m.path, broken, changed_line(fix, m.path) or 1, max_lines=max_region_lines,
                                 max_chars=max_chars)
            answer = as_answer(edit_format, region, fix)
            if answer is None:  # the fix reaches past the code the prompt would show
                continue
            statement = _statement(name, m.function, index, rng, fix, modules.setdefault(
                m.path, _public_names(clean)))
            messages = region_messages(edit_format, project.repo, statement, region) if edit_format != "diff" \
                else _diff_messages(project.repo, region, statement)
            out.append({"messages": [*messages, {"role": "assistant", "content": answer}], "repo": project.repo,
                        "path": m.path, "function": m.function, "kind": m.kind, "key": m.key})
            per_fn[fn] = per_fn.get(fn, 0) + 1
            made += 1
    return out


def _diff_messages(repo: str, region: Any, statement: str) -> list[dict]:
    """The `diff` format's prompt for a pair: the broken file shown around the bug, as `single_turn_messages`
    shows a task's oracle file."""
    from trainer.agent.prompts import SINGLE_TURN_SYSTEM

    lines = region.text.split("\n")
    shown = "\n".join(lines[region.start - 1 : region.end]) + "\n"
    user = (f"Repository: {repo}\nIssue:\n{statement.strip()}\n\nSource files:\n"
            f"--- {region.path} (lines {region.start}-{region.end} of {len(lines)})\n{shown}\n"
            "Answer with the unified diff only.")
    return [{"role": "system", "content": SINGLE_TURN_SYSTEM}, {"role": "user", "content": user}]
