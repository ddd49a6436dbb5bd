"""The principals, the clock and the Argon2id cost most tests share."""

from __future__ import annotations

from securepad import Principal

ALICE = Principal("alice", "planner", "web")
BOB = Principal("bob", "planner", "web")

# A fixed clock for stores opened with ``clock=lambda: NOW``.
NOW = 1_000_000.0

# Fast Argon2id for tests only; production defaults stay RFC 9106's.
FAST_ARGON2 = {"time_cost": 1, "memory_cost": 64, "parallelism": 1}

# The same owners as agents (the stored fixtures were written with these).
AGENT_ALICE = Principal("alice", "agent", "web")
AGENT_BOB = Principal("bob", "agent", "web")
SLACK_BOB = Principal("bob", "agent", "slack")
