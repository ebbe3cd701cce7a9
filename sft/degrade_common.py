"""Shared pieces of the degradations: the per-file context, the edit result, and small text helpers."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field


@dataclass
class FileCtx:
    """One file of the tree being degraded.

    `anchors` are 0-based indexes of lines the gold patch added (where fix-adjacent defects go); `untouched`
    are indexes of lines identical to the base commit (where out-of-scope defects go); `removed` are the
    lines the gold patch deleted from this file (material for commented-out code).
    """

    path: str
    lines: list[str]
    anchors: list[int]
    untouched: set[int]
    rng: random.Random
    removed: list[str] = field(default_factory=list)


@dataclass
class Edit:
    """The file's new lines, one line the defect added (to cite it and to find it in the diff), and why."""

    lines: list[str]
    marker: str
    description: str


# Renames a reviewer would call gratuitous: same meaning, different word.
SYNONYMS = {
    "value": "val",
    "result": "res",
    "data": "payload",
    "items": "entries",
    "text": "content",
    "total": "acc",
    "count": "num",
    "key": "k",
    "name": "label",
    "line": "row",
    "parts": "pieces",
    "out": "output",
    "res": "outcome",
    "values": "vals",
    "index": "idx",
    "length": "size",
    "cents": "amount_cents",
}


def rename_options(var: str, camel: bool) -> list[str]:
    alt = SYNONYMS.get(var)
    tail = [f"{var}Value", f"tmp{var[:1].upper()}{var[1:]}"] if camel else [f"{var}_value", f"tmp_{var}"]
    return ([alt] if alt else []) + tail


def indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def pick_new_name(text: str, options: list[str]) -> str:
    """The first option that does not already occur in `text` as a word (so a new name never collides)."""
    for name in options:
        if not re.search(rf"\b{re.escape(name)}\b", text):
            return name
    n = 2
    while re.search(rf"\b{re.escape(options[0])}{n}\b", text):
        n += 1
    return f"{options[0]}{n}"


def split_top_level(params: str) -> list[str]:
    """Split a parameter list at commas that are not inside brackets (generics, subscripts, defaults)."""
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def code_mask(text: str, language: str) -> list[bool]:
    """For a Go or Java source, True at each character that is code (not a string, rune, or comment)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        two = text[i : i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j == -1 else j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j == -1 else j + 2
        elif language == "java" and text.startswith('"""', i):
            j = text.find('"""', i + 3)
            j = n if j == -1 else j + 3
        elif text[i] in "\"'" or (language == "go" and text[i] == "`"):
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                if text[j] == "\\" and quote != "`":
                    j += 1
                elif text[j] == "\n" and quote != "`":
                    break
                j += 1
            j = min(n, j + 1)
        else:
            i += 1
            continue
        for k in range(i, j):
            mask[k] = False
        i = j
    return mask
