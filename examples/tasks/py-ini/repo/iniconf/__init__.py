from .config import Config, load
from .parser import IniError, parse_ini

__all__ = ["Config", "IniError", "load", "parse_ini"]
