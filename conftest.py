import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# CI gets a fixed example sequence; locally, hypothesis explores. No deadline: the CPU
# suite must pass on a busy machine, and a slow example is not a wrong one.
settings.register_profile(
    "ci", derandomize=True, max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# pytester's in-process runs drop modules first imported inside them, and numpy cannot be
# imported twice in one process: import it up front (tests/conftest.py imports the rest)
import numpy  # noqa: E402, F401
