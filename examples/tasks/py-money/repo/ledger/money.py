"""Rounding and splitting of money amounts."""

from decimal import Decimal


def round_money(amount, places=2):
    """Round ``amount`` to ``places`` decimal places, half-up (2.675 -> 2.68)."""
    return Decimal(str(round(float(amount), places)))


def to_cents(amount):
    """Integer cents of an amount that is already rounded to two places."""
    return int(Decimal(amount) * 100)


def split_evenly(total, parts):
    """Split ``total`` into ``parts`` amounts of whole cents that add up to ``total`` exactly;
    the first parts absorb the leftover cents."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    cents = to_cents(total)
    share, leftover = divmod(cents, parts)
    return [Decimal(share + (1 if i < leftover else 0)) / 100 for i in range(parts)]
