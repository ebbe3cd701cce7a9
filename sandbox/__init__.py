"""The sandbox: SWE-bench-compatible evaluation of patches in hardened Docker containers (apply the patch,
restore the tests, run them, grade from the test report), resumable and atomic on disk.
Entry points: `gagar eval` (`sandbox.cli`), `sandbox.run.evaluate_predictions(instances, predictions, config)`
returning `sandbox.records.EvalResult`s; rooms: `env/` (images, environments), `integrity/` (anti-forgery,
host-safe git), `parsers/` (test reports)."""
