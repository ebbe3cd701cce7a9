import pytest

from durations import parse_duration


def test_seconds():
    assert parse_duration("45s") == 45


def test_hours_and_minutes():
    assert parse_duration("1h30m") == 5400


def test_days_with_spaces():
    assert parse_duration("2d 4h") == 2 * 86400 + 4 * 3600


@pytest.mark.parametrize(
    "text",
    ["", "  ", "10", "h", "5x", "1h-30m"],
    ids=["empty", "blank", "no-unit", "no-number", "bad-unit", "negative"],
)
def test_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_duration(text)
