"""Stand-in for `aisimulate_core` (not on PyPI), so Dynamo's planner imports; see `sdk`."""
