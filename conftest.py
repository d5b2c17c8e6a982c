import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# CI gets a fixed example sequence; locally, hypothesis explores, each run other examples.
# Hypothesis's default count (100) where a test sets none; ``--hypothesis-profile=thorough``
# (tests/conftest.py) runs 20,000 once in a while. No deadline: the CPU suite must pass on
# a busy machine, and a slow example is not a wrong one.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# pytester's in-process runs drop modules first imported inside them, and numpy cannot be
# imported twice in one process: import it up front (tests/conftest.py imports the rest)
import numpy  # noqa: E402, F401
