from durations import format_duration, parse_duration


def test_format_compound():
    assert format_duration(5400) == "1h30m"


def test_format_zero():
    assert format_duration(0) == "0s"


def test_roundtrip():
    for text in ["3d", "1h1m1s", "59m"]:
        assert format_duration(parse_duration(text)) == text
