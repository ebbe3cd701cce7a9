"""Which candidates are tried, in what order: each is checked (its function still parses, its AST changed) and the
seed fixes the order — round robin over the bug kinds, each kind shuffled, at most `per_function` per function,
never two candidates that make the same code (so no two tasks share a diff).
"""

from __future__ import annotations

import ast
import itertools
import random
from collections.abc import Iterable, Iterator

from synth.mutate import KINDS, Mutation, SourceText


def _dump(tree: ast.AST) -> str:
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


class Checker:
    """Checks candidates against their files: the function still parses and its AST changed. Each check parses
    one function, not the file (parsing a big file per candidate costs minutes), so only the candidates that
    are screened pay for it. `result(m)` is the function's new text, or None for a broken or no-op edit."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self._texts: dict[str, SourceText] = {}
        self._dumps: dict[tuple[str, int, int], str | None] = {}

    def result(self, m: Mutation) -> str | None:
        source = self.sources[m.path]
        t = self._texts.get(m.path) or self._texts.setdefault(m.path, SourceText(source))
        lo, hi = t.line_start(m.func_lines[0]), t.line_end(m.func_lines[1])
        key = (m.path, lo, hi)
        if key not in self._dumps:
            self._dumps[key] = _parse_dump(source[lo:hi])
        original = self._dumps[key]
        new = source[lo:hi]
        for e in sorted(m.edits, key=lambda e: e.start, reverse=True):
            new = new[:e.start - lo] + e.text + new[e.end - lo:]
        dump = _parse_dump(new)
        return new if original is not None and dump is not None and dump != original else None


def _parse_dump(function_text: str) -> str | None:
    """The AST dump of a function's text (indented methods are parsed under an `if 1:`), None if it is broken."""
    text = function_text if not function_text[:1].isspace() else "if 1:\n" + function_text
    try:
        return _dump(ast.parse(text))
    except (SyntaxError, ValueError):
        return None


def iter_candidates(muts: Iterable[Mutation], seed: int, checker: Checker, *, per_function: int = 3,
                    kinds: Iterable[str] = KINDS) -> Iterator[Mutation]:
    """The screening order for a seed: round robin over `kinds`, each kind's candidates shuffled by the seed
    (sorted by key first, so the input order does not matter), at most `per_function` per function, only
    candidates the checker accepts, never two that make the same code. Lazy: only what is taken is checked."""
    by_kind: dict[str, list[Mutation]] = {k: [] for k in kinds}
    for m in muts:
        if m.kind in by_kind:
            by_kind[m.kind].append(m)
    for k, ms in by_kind.items():
        ms.sort(key=lambda m: m.key)
        random.Random(f"{seed}:{k}").shuffle(ms)
    per_fn: dict[tuple[str, str], int] = {}
    made: set[tuple[str, int, str]] = set()
    queues = {k: iter(ms) for k, ms in by_kind.items()}
    while queues:
        for k in list(queues):
            for m in queues[k]:
                fn = (m.path, m.function)
                if per_fn.get(fn, 0) >= per_function:
                    continue
                new = checker.result(m)
                if new is None or (m.path, m.func_lines[0], new) in made:
                    continue
                made.add((m.path, m.func_lines[0], new))
                per_fn[fn] = per_fn.get(fn, 0) + 1
                yield m
                break
            else:
                del queues[k]


def order_candidates(muts: Iterable[Mutation], seed: int, checker: Checker, *, per_function: int = 3,
                     kinds: Iterable[str] = KINDS, limit: int | None = None) -> list[Mutation]:
    """The first `limit` (all, without one) of `iter_candidates`."""
    it = iter_candidates(muts, seed, checker, per_function=per_function, kinds=kinds)
    return list(it if limit is None else itertools.islice(it, limit))
