"""Integrity: what keeps a policy from faking a verdict or reaching the host (report cross-checks, the result
channel and its guest plugin, host-safe git, the tree diff computed without running git in a policy's tree).
Entry points: `checks.check(...)` (the cross-checks of a run's verdict), `gitsafe` (the one hardened host-git
helper), `channel` (the result channel a run's guest plugin writes), `treediff` (what a policy changed)."""
