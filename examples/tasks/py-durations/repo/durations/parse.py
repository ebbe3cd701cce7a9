"""Parsing of duration strings like ``1h30m`` into seconds."""

import re

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

_TOKEN = re.compile(r"(\d+)(m|ms|s|h|d)")


def parse_duration(text):
    """Return the number of seconds in ``text`` (e.g. ``"1h30m"`` -> 5400.0).

    Raises ValueError for empty or malformed input.
    """
    compact = text.strip().replace(" ", "")
    if not compact:
        raise ValueError("empty duration")
    total = 0.0
    pos = 0
    for match in _TOKEN.finditer(compact):
        if match.start() != pos:
            break
        total += int(match.group(1)) * UNITS[match.group(2)]
        pos = match.end()
    if pos != len(compact):
        raise ValueError(f"invalid duration: {text!r}")
    return total
