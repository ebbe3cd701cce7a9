"""Renamed copies of judge conversations, so a small judge learns to read its prompt instead of its training set.

A few bundled repositories give every training conversation the same handful of file names, so a model trained
from scratch can lower its loss by recalling `durations/parse.py` rather than copying the path the prompt shows;
on a held-out repository it then cites files that do not exist and counts candidates wrong. A renamed copy maps
every path component and the repository's name to fresh pseudo-words, consistently across the problem statement,
the candidate summary, the static findings and the answer, so the only way to cite correctly is to copy from the
prompt. Rankings, tiers, letters and line numbers are left as they are: the label does not change.
"""

from __future__ import annotations

import copy
import random
import re
from typing import Any

# A path as the summaries and findings print it: components of word characters, dots and dashes, and an extension.
_PATH = re.compile(r"(?<![\w/.-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_][\w-]*\.[A-Za-z]{1,5})(?=[\s:;,()\"']|$)")
_REPO = re.compile(r"^Repository: (\S+)$", re.M)
_SYLLABLES = ("ba", "ko", "ri", "tu", "men", "sal", "vor", "ne", "dil", "pra", "gu", "zet", "lo", "fin", "ca",
              "mo", "ser", "tha", "wi", "qua", "rel", "do", "xi", "bor")
_KEEP = {"__init__", "__main__", "conftest", "setup", "main", "test", "tests", "src", "pkg", "internal", "cmd", "lib",
         "java", "python", "golang", "resources"}


def _word(rng: random.Random, taken: set[str]) -> str:
    while True:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        if w not in taken:
            taken.add(w)
            return w


def rename_map(texts: list[str], rng: random.Random) -> dict[str, str]:
    """Component -> pseudo-word for every path component (directory names, file stems) and repository name part
    found in `texts`; conventional names (`__init__`, `tests`, ...) stay, so the copy keeps a codebase's shape."""
    names: list[str] = []
    keep = set(_KEEP)
    for text in texts:
        for path in _PATH.findall(text):
            *dirs, leaf = path.split("/")
            stem, ext = leaf.rsplit(".", 1)
            names += [*dirs, stem]
            keep.add(ext)  # `.go`, `.java`: a language's names are not the repository's
        for repo in _REPO.findall(text):
            names += repo.split("/")
    taken: set[str] = set()
    out: dict[str, str] = {}
    for name in dict.fromkeys(names):
        if name and name not in keep and len(name) > 2:
            out[name] = _word(rng, taken)
    return out


def _apply(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    # Whole names only (a stem inside a longer identifier stays), longest first so `parse_ini` wins over `parse`.
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True)))
                         + r")(?![A-Za-z0-9])")
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def renamed_record(record: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy of a judge conversation record with its repository's names replaced everywhere but the system
    prompt (which names no repository). The label fields (order, tiers, letters) are unchanged."""
    out = copy.deepcopy(record)
    msgs = out["messages"]
    mapping = rename_map([m["content"] for m in msgs if m["role"] != "system"], rng)
    for m in msgs:
        if m["role"] != "system":
            m["content"] = _apply(m["content"], mapping)
    out["renamed"] = True
    return out
