"""Repository-wide pytest configuration: the real-cluster and Prometheus fixtures of the harness, and
the property tests' profile.

Property tests explore new examples on every run by default. `HYPOTHESIS_PROFILE=ci` (hack/test sets
it) draws them from a fixed seed instead, so the gate on a commit passes or fails by the code alone;
the examples a wider local run finds become table cases.
"""

import os

from hypothesis import settings

pytest_plugins = ["e2e.harness.fixtures"]

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
