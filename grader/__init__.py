"""grader package."""
