"""The behavioural hack probe: a group's failing tests re-run renamed, perturbed and instrumented in the sandbox,
plus the replay of the changed functions off the test. Entry point: `grader.probe.runner.probe_group(instance,
patches, config)`; `transform` builds the instrumented tests, `verdicts` and `replay` judge what they recorded,
`common` holds the run record they share. `runtime.py`, `replay_runtime.py` and `replay_nudges.py` run inside
the task's container (standard library only; their source is planted by `transform`)."""
