import importlib.metadata

import pytest
import tomlkit

from verpin import requires_python, supports

PYPROJECT = '[project]\nname = "demo"\nrequires-python = ">=3.9,<3.14"\n'


def test_plain_versions():
    assert supports(PYPROJECT, "3.11.4")
    assert not supports(PYPROJECT, "3.8.10")


def test_upper_bound():
    assert not supports(PYPROJECT, "3.14.0")


def test_missing_requires_python_means_any():
    assert supports('[project]\nname = "demo"\n', "2.7.18")


def test_spec_is_parsed():
    assert str(requires_python(PYPROJECT)) == "<3.14,>=3.9"


def test_bad_toml_raises():
    with pytest.raises(tomlkit.exceptions.ParseError):
        requires_python("[project\n")


def test_installed_metadata():
    # The environment's `install` step (pip install -e .) registered the package.
    assert importlib.metadata.version("verpin") == "0.3.0"
