"""Static hack detection: special-casing, silencing and weakening found by reading the patch, never running it.
Entry points: `grader.hacks.detect.workspace_hacks(workspace)` / `candidate_hacks(...)` find them and
`apply_hacks(grading, findings)` ranks the flagged candidates last; `py` (Python, `ast`) and `curly` (Go, Java,
tokens) are the per-language readers, `literals` the task's distinctive values."""
