import pytest

from iniconf import Config, IniError, parse_ini

SAMPLE = """
# service settings
[server]
Host = 0.0.0.0
port = 8080

[features]
debug = no
"""


def test_sections_and_keys():
    data = parse_ini(SAMPLE)
    assert data == {"server": {"host": "0.0.0.0", "port": "8080"}, "features": {"debug": "no"}}


def test_values_keep_case():
    assert parse_ini("[app]\nname = MyService\n")["app"]["name"] == "MyService"


def test_key_outside_section():
    with pytest.raises(IniError, match="line 1"):
        parse_ini("key = value\n")


def test_line_without_equals():
    with pytest.raises(IniError, match="line 2"):
        parse_ini("[a]\njust words\n")


def test_typed_getters():
    cfg = Config(parse_ini(SAMPLE))
    assert cfg.get_int("server", "port") == 8080
    assert cfg.get_bool("features", "debug") is False
