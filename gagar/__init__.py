"""gagar: the `gagar` command tying the sandbox, grader, inference, sft, synth and trainer packages together.
Entry points: `gagar.cli.main` (each command dispatches to its package's CLI, imported only when run) and
`gagar.schema` (the pydantic config machinery shared by `gagar train` and `gagar sft train`)."""

__version__ = "0.1.0"
