"""Exponential back-off delays for retries."""

import random


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Delay before retry number `attempt` (0-based): base * 2**attempt, at most `cap`."""
    return min(cap, base * 2 ** (attempt + 1))


def jitter(delay: float) -> float:
    """`delay` plus up to 100% random jitter."""
    return delay + random.uniform(0, delay)
