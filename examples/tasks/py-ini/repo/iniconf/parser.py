"""Parsing of INI text into nested dictionaries."""


class IniError(ValueError):
    """The text is not valid INI; the message names the line."""


def parse_ini(text):
    """Return ``{section: {key: value}}``; keys are lower-cased, values are stripped strings."""
    sections = {}
    current = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        if current is None:
            raise IniError(f"line {lineno}: key outside of any section")
        if "=" not in line:
            raise IniError(f"line {lineno}: expected 'key = value', got {line!r}")
        key, value = line.split("=")
        current[key.strip().lower()] = value.strip()
    return sections
