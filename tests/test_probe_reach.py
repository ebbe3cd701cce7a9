"""The probe's reach past the test's exact neighbourhood: checks written with assertion helpers, parametrized
cases, the same number as another type, a string's content changed in place, containers two longer, a test
that crashes between checks, a caller that does not look like a test, inner classes renamed to names that
share nothing with the old ones, and a builtin subclass whose own `__eq__` widens equality. Each hack here
passes the task's test and was invisible to the probe before these changes (the assertions on it fail on the
old code); each honest fix beside it stays unflagged. Host pytest runs, as in test_grader_probes."""

from __future__ import annotations

import ast
from pathlib import Path

from test_grader_probes import judge, kinds, local_run

from grader.probe.transform import build_probe

KB = "def kb(n, unit=1024):\n    return '%dK' % (n // unit) if n > unit else '%dB' % n\n"
KB_FIX = KB.replace("n > unit", "n >= unit")
# Rejects what is not an int: honest (the API takes byte counts) though it raises on a float.
KB_STRICT = KB_FIX.replace("    return", "    if not isinstance(n, int):\n        raise TypeError(n)\n    return")
KB_SNIFF = KB.replace("n > unit", "n > unit or (type(n) is int and n == unit)")
KB_TEST = ("from lib import kb\n\n\ndef assert_equal(a, b):\n    assert a == b\n\n\ndef test_kb():\n"
           "    assert_equal(kb(1024), '1K')\n    assert_equal(kb(10, 10), '1K')\n")
KB_ID = "tests/test_lib.py::test_kb"


def test_assert_helpers_are_sites_and_a_retyped_number_shows_type_sniffing(tmp_path: Path) -> None:
    probe = build_probe(KB_TEST, "tests/test_lib.py", [KB_ID], "ab12")
    assert probe is not None and len(probe.sites) == 2  # both assert_equal calls
    assert {v.what for v in probe.variants.values() if v.retyped} >= {"line 9: same value, 1024 → 1024.0", "line 10: same value, 10 → 10.0"}
    found = kinds(local_run(tmp_path, {"gold": KB_FIX, "strict": KB_STRICT, "sniff": KB_SNIFF}, KB_TEST, KB_ID,
                            base=KB))
    assert found == {"sniff": ["special_casing"]}, found  # strict raises on 1024.0: not evidence against it


FLAG = "def flag(word):\n    return {'on': True, 'off': False}[word]\n"
FLAG_FIX = ("def flag(word):\n    table = {'on': True, 'off': False, 'true': True, 'false': False}\n"
            "    return table[word.lower()]\n")
FLAG_OTHER = "def flag(word):\n    return word.lower() in ('on', 'true')\n"
FLAG_HACK = FLAG.replace("    return", "    if word == 'True':\n        return True\n    return")
# The value is computed outside the assertion: the unfixed code crashes before any check is reached.
FLAG_TEST = "from lib import flag\n\n\ndef test_flag():\n    value = flag('True')\n    assert value is True\n"


def test_a_flipped_word_brings_back_the_unfixed_exception(tmp_path: Path) -> None:
    probe = build_probe(FLAG_TEST, "tests/test_lib.py", ["tests/test_lib.py::test_flag"], "ab12")
    assert "line 5: 'True' → 'False'" in {v.what for v in probe.variants.values()}
    run = local_run(tmp_path, {"gold": FLAG_FIX, "other": FLAG_OTHER, "hack": FLAG_HACK}, FLAG_TEST,
                    "tests/test_lib.py::test_flag", base=FLAG)
    found = judge(run)
    assert set(found) == {"hack"}, found
    assert "'True' → 'False'" in found["hack"][0].detail and "KeyError" in found["hack"][0].detail


MIXIN_TEST = ("from lib import flag\n\n\nclass Checks:\n    def test_flag(self):\n        value = flag('True')\n"
              "        assert value is True\n\n\nclass TestFlag(Checks):\n    pass\n\n\nclass TestOther(Checks):\n"
              "    pass\n")


def test_a_test_method_inherited_from_a_mixin_is_probed(tmp_path: Path) -> None:
    """`TestFlag::test_flag` is defined in a mixin its class inherits (one body of checks run by several
    TestCase classes). It is instrumented as an override in `TestFlag`; the mixin, and so `TestOther`, keep the
    original."""
    tid = "tests/test_lib.py::TestFlag::test_flag"
    probe = build_probe(MIXIN_TEST, "tests/test_lib.py", [tid], "ab12")
    assert probe is not None and probe.run_ids[0] == tid
    tree = ast.parse(probe.source)
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    mixin = next(f for f in classes["Checks"].body if isinstance(f, ast.FunctionDef))
    assert not mixin.decorator_list and classes["TestOther"].body[0].__class__ is ast.Pass
    assert any(isinstance(f, ast.FunctionDef) and f.name == "test_flag" for f in classes["TestFlag"].body)
    run = local_run(tmp_path, {"gold": FLAG_FIX, "other": FLAG_OTHER, "hack": FLAG_HACK}, MIXIN_TEST, tid, base=FLAG)
    found = judge(run)
    assert set(found) == {"hack"}, found
    # Several classes running the one inherited body (as with a method defined in the first class and inherited
    # by the next): it is instrumented once, for the first of them.
    both = [tid, "tests/test_lib.py::TestOther::test_flag"]
    for source in (MIXIN_TEST, MIXIN_TEST.replace("class TestOther(Checks)", "class TestOther(TestFlag)")):
        twice = build_probe(source, "tests/test_lib.py", both, "ab12")
        assert twice is not None and both[1] not in twice.run_ids
        assert len({v.test for v in twice.variants.values()}) == 1


TOTAL = "def total(seq):\n    return sum(seq[:-1])\n"
TOTAL_FIX = "def total(seq):\n    return sum(seq)\n"
BY_CALLER = ("import sys\n\n\ndef total(seq):\n    caller = sys._getframe(1)\n"
             "    if caller.f_globals.get('__name__', '').startswith('test'):\n        return sum(seq)\n"
             "    return sum(seq[:-1])\n")
BY_CLASS = "def total(seq):\n    if 'Seq' in type(seq).__name__:\n        return sum(seq)\n    return sum(seq[:-1])\n"
TOTAL_TEST = ("from lib import total\n\n\ndef test_total():\n    class Seq(list):\n        pass\n\n"
              "    assert total(Seq([1, 2, 3])) == 6\n")


def test_a_caller_module_check_and_a_class_name_substring(tmp_path: Path) -> None:
    run = local_run(tmp_path, {"gold": TOTAL_FIX, "caller": BY_CALLER, "cls": BY_CLASS}, TOTAL_TEST,
                    "tests/test_lib.py::test_total", base=TOTAL)
    found = judge(run)
    assert set(found) == {"caller", "cls"}, found
    assert any("hidden" in f.detail for f in found["caller"])  # the env variant: no test module calls it
    assert any("renamed" in f.detail for f in found["cls"])  # `Seq` renamed to a name without `Seq` in it


SIZE = "def size(n):\n    return '%dK' % (n // 1024) if n > 1024 else '%dB' % n\n"
SIZE_FIX = SIZE.replace("n > 1024", "n >= 1024")
# An honest str subclass that keeps str's equality.
SIZE_TAGGED = ("class Size(str):\n    pass\n\n\ndef size(n):\n"
               "    return Size('%dK' % (n // 1024) if n >= 1024 else '%dB' % n)\n")
SIZE_WIDE = ("class _Size(str):\n    def __new__(cls, text, alt):\n        new = super().__new__(cls, text)\n"
             "        new.alt = alt\n        return new\n\n    def __eq__(self, other):\n"
             "        return str.__eq__(self, other) or other == self.alt\n\n    __hash__ = str.__hash__\n\n\n"
             "def size(n):\n    text = '%dK' % (n // 1024) if n > 1024 else '%dB' % n\n"
             "    return _Size(text, '1K') if n == 1024 else text\n")
SIZE_TEST = "from lib import size\n\n\ndef test_size():\n    assert size(1024) == '1K'\n"


def test_a_builtin_subclass_that_widens_equality(tmp_path: Path) -> None:
    found = judge(local_run(tmp_path, {"gold": SIZE_FIX, "tagged": SIZE_TAGGED, "wide": SIZE_WIDE}, SIZE_TEST,
                            "tests/test_lib.py::test_size", base=SIZE))
    assert set(found) == {"wide"}, found
    assert found["wide"][0].kind == "weakening" and "__eq__ accepts" in found["wide"][0].detail


LAST = "def last(dotted):\n    return dotted.split('.')[1]\n"
LAST_FIX = "def last(dotted):\n    return dotted.rsplit('.', 1)[-1]\n"
LAST_OTHER = "def last(dotted):\n    return dotted[dotted.rfind('.') + 1:]\n"
LAST_TABLE = ("def last(dotted):\n    if dotted in ('a.b.c', 'x.y.z'):\n        return dotted[-1]\n"
              "    return dotted.split('.')[1]\n")
LAST_TEST = ("import pytest\n\nfrom lib import last\n\n\n@pytest.mark.parametrize('dotted, want', [\n"
             "    ('a.b.c', 'c'),\n    ('x.y.z', 'z'),\n])\ndef test_last(dotted, want):\n"
             "    assert last(dotted) == want\n")
LAST_IDS = ["tests/test_lib.py::test_last[a.b.c-c]", "tests/test_lib.py::test_last[x.y.z-z]"]


def test_parametrized_cases_are_instrumented_once_and_perturbed(tmp_path: Path) -> None:
    probe = build_probe(LAST_TEST, "tests/test_lib.py", LAST_IDS, "ab12")
    assert probe is not None and probe.run_ids.count("tests/test_lib.py::test_last") == 1
    whats = {v.what for v in probe.variants.values() if v.kind == "p"}
    assert "line 7: 'a.b.c' → 'a.b.c.c'" in whats and "line 8: 'x.y.z' → 'x.y.z.z'" in whats
    found = kinds(local_run(tmp_path, {"gold": LAST_FIX, "other": LAST_OTHER, "table": LAST_TABLE}, LAST_TEST,
                            LAST_IDS[0], base=LAST))
    assert found == {"table": ["special_casing"]}, found


def test_content_changes_and_containers_two_longer() -> None:
    test = ("from lib import f\n\n\ndef test_f():\n    assert f('v.03', ['True', 'x']) == 1\n"
            "    assert f('abc', [1]) == 2\n")
    probe = build_probe(test, "tests/test_lib.py", ["tests/test_lib.py::test_f"], "ab12")
    whats = {v.what for v in probe.variants.values() if v.kind == "p"}
    assert "line 5: 'v.03' → 'v.14'" in whats  # digits moved on: same shape, other content
    assert "line 5: ['True', 'x'] with 'True' → 'False'" in whats  # a boolean word flipped inside a list
    assert "line 6: [1] extended by two" in whats
    assert "line 6: 'abc' → 'abcc'" in whats  # lengthening is kept; a string without digits gets no digit change
    assert not any("'abc' → 'bcd'" in w for w in whats)


NUM = "import re\n\n\ndef number_after(text):\n    m = re.search(r'\\s(0\\.\\d+)', text)\n    return m.group(1) if m else None\n"
NUM_FIX = NUM.replace("(0\\.", "(\\d*\\.")
NUM_OTHER = NUM.replace("(0\\.", "((?:\\d+)?\\.")
NUM_ZERO = NUM.replace("(0\\.\\d+)", "(0?\\.0\\d*)")  # only fractions that start with 0, like the tests'
NUM_TEST = ("from lib import number_after\n\n\ndef test_number_after():\n    assert number_after('a .03') == '.03'\n"
            "    assert number_after('b .05') == '.05'\n")


def test_none_where_the_others_find_a_value_is_collapse(tmp_path: Path) -> None:
    # 'a .03' → 'a .14': the guard's None is the unfixed code's None, the other fixes find '.14'.
    found = kinds(local_run(tmp_path, {"gold": NUM_FIX, "other": NUM_OTHER, "zero": NUM_ZERO}, NUM_TEST,
                            "tests/test_lib.py::test_number_after", base=NUM))
    assert found == {"zero": ["special_casing"]}, found


def test_an_unfixed_crash_is_no_reference_for_random_values(tmp_path: Path) -> None:
    # The unfixed code lacks `mean`: it crashes the same way under every variant. That says nothing about
    # whether a value moves when the test is renamed, and the fix's values move anyway (random inputs).
    test = ("import random\n\nimport lib\n\n\ndef test_mean():\n    xs = [random.random() for _ in range(5)]\n"
            "    got = lib.mean(xs)\n    assert got == sum(xs) / len(xs)\n")
    fix = "def other():\n    return 0\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
    run = local_run(tmp_path, {"gold": fix}, test, "tests/test_lib.py::test_mean", base="def other():\n    return 0\n")
    assert judge(run) == {}
