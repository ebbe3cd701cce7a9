"""Slug generation."""

import re
import unicodedata


def slugify(value, separator="-", max_length=None):
    """Lower-case ASCII slug of ``value``: accents are folded, punctuation is dropped and
    whitespace, underscores and dashes become ``separator``."""
    value = unicodedata.normalize("NFKD", str(value))
    value = value.encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    value = re.sub(r"[\s_-]", separator, value)
    if max_length is not None:
        value = value[:max_length].rstrip(separator)
    return value


def unique_slug(value, taken, separator="-"):
    """A slug of ``value`` that is not in ``taken``, adding ``-2``, ``-3``... as needed."""
    base = slugify(value, separator=separator)
    candidate = base
    counter = 2
    while candidate in taken:
        candidate = f"{base}{separator}{counter}"
        counter += 1
    return candidate
