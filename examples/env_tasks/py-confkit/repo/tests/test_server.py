import attrs
import pytest

from confkit import ServerConfig, from_mapping, to_mapping


def test_defaults():
    cfg = ServerConfig()
    assert (cfg.host, cfg.port, cfg.workers) == ("127.0.0.1", 8080, 1)


def test_port_is_converted():
    assert ServerConfig(port="9000").port == 9000


def test_port_zero_rejected():
    with pytest.raises(ValueError, match="port"):
        ServerConfig(port=0)


def test_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ServerConfig().port = 1


def test_from_mapping_ignores_unknown_keys():
    assert from_mapping({"port": 81, "colour": "blue"}) == ServerConfig(port=81)


def test_url():
    assert ServerConfig(host="example.org", port=8443).url() == "http://example.org:8443/"


def test_roundtrip_through_mapping():
    cfg = ServerConfig(host="h", port=1234, workers=3)
    assert from_mapping(to_mapping(cfg)) == cfg
