"""Typed access to parsed INI data."""

from pathlib import Path

from .parser import parse_ini

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


class Config:
    def __init__(self, sections):
        self.sections = sections

    def get(self, section, key, default=None):
        return self.sections.get(section, {}).get(key.lower(), default)

    def get_int(self, section, key, default=None):
        value = self.get(section, key)
        return default if value is None else int(value)

    def get_bool(self, section, key, default=False):
        value = self.get(section, key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"[{section}] {key}: not a boolean: {value!r}")


def load(path):
    return Config(parse_ini(Path(path).read_text(encoding="utf-8")))
