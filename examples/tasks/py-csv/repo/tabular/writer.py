"""CSV output (RFC 4180: comma separated, CRLF line ends, fields quoted when needed)."""

SEPARATOR = ","
LINE_END = "\r\n"


def format_field(value):
    """One CSV field; ``None`` becomes an empty field."""
    text = "" if value is None else str(value)
    if SEPARATOR in text or '"' in text or "\n" in text:
        return '"' + text + '"'
    return text


def format_row(values):
    return SEPARATOR.join(format_field(v) for v in values) + LINE_END


def write_csv(path, records, columns):
    """Write ``records`` (dicts) to ``path`` with a header row of ``columns``."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(format_row(columns))
        for record in records:
            fh.write(format_row(record.get(c) for c in columns))
