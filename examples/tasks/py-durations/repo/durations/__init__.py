"""Human-friendly durations."""

from .format import format_duration
from .parse import parse_duration

__all__ = ["format_duration", "parse_duration"]
__version__ = "0.3.1"
