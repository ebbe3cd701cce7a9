"""Integrity: what keeps a policy from faking a verdict or reaching the host (report cross-checks, the result
channel and its guest plugin, host-safe git, the tree diff computed without running git in a policy's tree)."""
