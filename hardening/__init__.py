"""The reliability suite (issue 7): an adversarial corpus, fault injection and load, run through `gagar eval`.

Not a product package: it is test and benchmark code, imported by `tests/test_hardening*.py` and
`bench/reliability.py` with the repository root on `sys.path`.
"""
