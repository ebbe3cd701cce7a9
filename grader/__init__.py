"""The grader: ranks the passing candidates of a group in one shared workspace, by a heuristic over diff
features or an agentic LLM judge, with hack findings ranked last. Entry points: `gagar grade` (`grader.cli`),
`grader.grade.grade_groups(groups, repos_dir, judge=...)` returning `grader.records.Grading`s; rooms: `judge/`
(the LLM judge), `hacks/` (static hack detection), `probe/` (the behavioural probe)."""
