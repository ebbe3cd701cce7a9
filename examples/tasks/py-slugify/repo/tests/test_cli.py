from slugkit.cli import main


def test_cli_prints_slugs(capsys):
    assert main(["Hello World", "Foo"]) == 0
    assert capsys.readouterr().out == "hello-world\nfoo\n"
