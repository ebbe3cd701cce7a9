"""Controlled experiments that show GAPO's and GAGAR's mechanisms on CPU with the real advantage engine and
sandbox verdicts. Entry point: `gagar experiment loop|bloat|skew` (`trainer.experiments.cli.main`); each writes
its figures and JSON to `--out`."""
