"""Formatting of seconds back into the compact duration syntax."""

_STEPS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds):
    """Format a number of seconds, e.g. 5400 -> ``"1h30m"``; sub-second parts are dropped."""
    remaining = int(seconds)
    if remaining == 0:
        return "0s"
    parts = []
    for unit, size in _STEPS:
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
