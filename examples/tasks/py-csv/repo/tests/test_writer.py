import csv
import io

from tabular import format_field, format_row, write_csv
from tabular.columns import infer_columns


def test_plain_fields_are_not_quoted():
    assert format_row(["a", 1, None]) == "a,1,\r\n"


def test_field_with_comma_is_quoted():
    assert format_field("Smith, John") == '"Smith, John"'


def test_field_with_newline_is_quoted():
    assert format_field("line1\nline2") == '"line1\nline2"'


def test_write_csv(tmp_path):
    out = tmp_path / "people.csv"
    write_csv(out, [{"name": "Ada", "city": "London"}], columns=["name", "city"])
    assert out.read_bytes() == b"name,city\r\nAda,London\r\n"


def test_roundtrip_simple_values():
    row = format_row(["x", "y, z", ""])
    assert next(csv.reader(io.StringIO(row))) == ["x", "y, z", ""]


def test_infer_columns():
    assert infer_columns([{"a": 1}, {"b": 2, "a": 3}]) == ["a", "b"]
