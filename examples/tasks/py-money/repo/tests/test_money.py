from decimal import Decimal

import pytest

from ledger import round_money, split_evenly, to_cents
from ledger.currency import format_amount


def test_round_plain():
    assert round_money(Decimal("10.994")) == Decimal("10.99")


def test_round_places():
    assert round_money(Decimal("1.23456"), places=3) == Decimal("1.235")


def test_to_cents():
    assert to_cents(Decimal("12.34")) == 1234


def test_split_evenly_adds_up():
    parts = split_evenly(Decimal("10.00"), 3)
    assert parts == [Decimal("3.34"), Decimal("3.33"), Decimal("3.33")]
    assert sum(parts) == Decimal("10.00")


def test_split_rejects_zero_parts():
    with pytest.raises(ValueError):
        split_evenly(Decimal("1.00"), 0)


def test_format_amount():
    assert format_amount(Decimal("1234.5"), "EUR") == "€1,234.50"
