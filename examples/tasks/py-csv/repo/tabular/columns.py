"""Helpers to pick the columns of a table."""


def infer_columns(records):
    """Columns in first-seen order across all records."""
    seen = []
    for record in records:
        for key in record:
            if key not in seen:
                seen.append(key)
    return seen
