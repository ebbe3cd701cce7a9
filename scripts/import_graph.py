"""The import graph of gagar's packages, read with `ast` (nothing is imported): package- and module-level edges,
import circles, and files over the line cap.

    python scripts/import_graph.py            # the report; exit 1 on a module circle or an unlisted long file
    python scripts/import_graph.py --modules  # also every module-level edge

Every `import` statement is an edge, wherever it stands, each marked by kind: `top` (runs when the module is
imported), `lazy` (inside a function: runs on the call) and `typing` (under `if TYPE_CHECKING:`: never runs). A
circle through a lazy import still ties the two modules together — neither can be understood, moved or tested
without the other, and which import runs first depends on the call order — so circles are looked for over all
three kinds. Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`; those implicit edges are not
counted (every submodule would otherwise be in a circle with a package that re-exports it).
tests/test_house.py holds the same checks as assertions.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The packages that ship (pyproject's packages.find), and hardening: not shipped, but code under the same rules.
PACKAGES = ("gagar", "sandbox", "grader", "inference", "sft", "synth", "trainer", "hardening")
MAX_LINES = 500
# Files allowed past MAX_LINES, each with why; the test fails on any other (and on a listed one that shrank).
LONG_FILES: dict[str, str] = {}
GRADER_TOP_MAX = 9  # .py files directly under grader/, __init__ included: "under ten"


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    kind: str  # top | lazy | typing
    line: int


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, kind) for every import statement of a module."""
    def walk(node: ast.AST, kind: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "lazy")
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and kind == "top":
                for st in child.body:
                    yield from walk(ast.Module(body=[st], type_ignores=[]), "typing")
                for st in child.orelse:
                    yield from walk(ast.Module(body=[st], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)
    yield from walk(tree, "top")


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that `name` (a.b.c, or a.b plus an imported attribute c) names."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def build_graph(root: Path = ROOT) -> tuple[set[str], list[Edge]]:
    files = product_files(root)
    modules = {module_name(p, root) for p in files}
    edges: list[Edge] = []
    for path in files:
        src = module_name(path, root)
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, kind in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the package holding this module
                    pkg = src.split(".") if is_pkg else src.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                dst = _resolve(t, modules)
                if dst and dst != src:
                    edges.append(Edge(src, dst, kind, node.lineno))
    return modules, edges


def package_of(module: str, modules: set[str], root: Path = ROOT) -> str:
    """The (sub-)package a module belongs to: itself for a package's __init__, else its parent."""
    if (root / module.replace(".", "/") / "__init__.py").exists():
        return module
    return module.rpartition(".")[0] or module


def cycles(nodes: set[str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative), each sorted."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if a != b:
            succ[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(succ[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def module_cycles(modules: set[str], edges: list[Edge], kinds: tuple[str, ...] = ("top", "lazy", "typing")
                  ) -> list[list[str]]:
    return cycles(modules, [(e.src, e.dst) for e in edges if e.kind in kinds])


def long_files(root: Path = ROOT, cap: int = MAX_LINES) -> dict[str, int]:
    out = {}
    for p in product_files(root):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > cap:
            out[str(p.relative_to(root))] = n
    return out


def grader_top(root: Path = ROOT) -> list[str]:
    return sorted(p.name for p in (root / "grader").glob("*.py"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--modules", action="store_true", help="also print every module-level edge")
    args = ap.parse_args(argv)
    modules, edges = build_graph()
    top_pkgs: dict[tuple[str, str], int] = defaultdict(int)
    sub_pkgs: dict[tuple[str, str], int] = defaultdict(int)
    for e in edges:
        a, b = e.src.split(".")[0], e.dst.split(".")[0]
        if a != b:
            top_pkgs[a, b] += 1
        pa, pb = package_of(e.src, modules), package_of(e.dst, modules)
        if pa != pb:
            sub_pkgs[pa, pb] += 1
    print(f"{len(modules)} modules, {len(edges)} imports "
          f"({sum(e.kind == 'top' for e in edges)} top, {sum(e.kind == 'lazy' for e in edges)} lazy, "
          f"{sum(e.kind == 'typing' for e in edges)} typing)\n")
    print("packages (importer -> imported: number of imports)")
    for a in sorted({a for a, _ in top_pkgs}):
        print(f"  {a:10} -> " + ", ".join(f"{b} {n}" for (x, b), n in sorted(top_pkgs.items()) if x == a))
    print("\nsub-packages")
    for a in sorted({a for a, _ in sub_pkgs}):
        print(f"  {a:22} -> " + ", ".join(f"{b} {n}" for (x, b), n in sorted(sub_pkgs.items()) if x == a))
    if args.modules:
        print("\nmodules")
        for e in sorted(edges, key=lambda e: (e.src, e.dst, e.line)):
            print(f"  {e.src} -> {e.dst}  ({e.kind}, line {e.line})")
    bad = 0
    print()
    for title, found in (("package circles", cycles({a for a, _ in top_pkgs} | {b for _, b in top_pkgs},
                                                    list(top_pkgs))),
                         ("sub-package circles (informative: a sub-package may use its parent's modules)",
                          cycles({a for a, _ in sub_pkgs} | {b for _, b in sub_pkgs}, list(sub_pkgs))),
                         ("module circles (top, lazy and typing imports)", module_cycles(modules, edges))):
        print(f"{title}: {len(found) or 'none'}")
        for c in found:
            print("  " + " <-> ".join(c))
        if not title.startswith("sub-package"):
            bad += len(found)
    longs = long_files()
    print(f"\nfiles over {MAX_LINES} lines: {len(longs) or 'none'}")
    for f, n in sorted(longs.items()):
        why = LONG_FILES.get(f)
        print(f"  {f}: {n}" + (f" (allowed: {why})" if why else ""))
        bad += why is None
    top = grader_top()
    print(f"\ngrader/ top level: {len(top)} .py files ({', '.join(top)})")
    bad += len(top) > GRADER_TOP_MAX
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
