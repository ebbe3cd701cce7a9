from slugkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello World") == "hello-world"


def test_punctuation_dropped():
    assert slugify("Hello, World!") == "hello-world"


def test_accents_folded():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_dashes_and_underscores_become_separator():
    assert slugify("foo_bar-baz") == "foo-bar-baz"


def test_custom_separator():
    assert slugify("snake_case name", separator="_") == "snake_case_name"


def test_max_length_strips_trailing_separator():
    assert slugify("hello world again", max_length=6) == "hello"


def test_unique_slug_appends_counter():
    assert unique_slug("Hello World", {"hello-world", "hello-world-2"}) == "hello-world-3"
