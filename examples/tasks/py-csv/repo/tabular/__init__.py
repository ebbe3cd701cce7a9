from .writer import format_field, format_row, write_csv

__all__ = ["format_field", "format_row", "write_csv"]
