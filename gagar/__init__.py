"""gagar: the command-line entry point tying the sandbox, grader, sft and trainer packages together."""

__version__ = "0.1.0"
