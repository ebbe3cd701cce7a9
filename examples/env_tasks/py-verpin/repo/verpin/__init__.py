"""Read `requires-python` from a pyproject.toml and check interpreters against it."""

import tomlkit
from packaging.specifiers import SpecifierSet
from packaging.version import Version


def requires_python(pyproject_text: str) -> SpecifierSet:
    """The project's `requires-python` (an empty set, matching everything, when absent)."""
    data = tomlkit.parse(pyproject_text)
    return SpecifierSet(data.get("project", {}).get("requires-python", ""))


def supports(pyproject_text: str, python: str) -> bool:
    """Whether interpreter version `python` (e.g. "3.12.1") satisfies the project's requires-python."""
    spec = requires_python(pyproject_text)
    return spec.contains(Version(python))
