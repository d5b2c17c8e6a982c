import os
import sys

from hypothesis import HealthCheck, settings

# Bytecode caches, as Python writes them by default, on a machine whose environment turns
# them off (PYTHONDONTWRITEBYTECODE, as this project's CI machine does): there every process
# of a run compiled the package again, and pytest rewrote every test module again in each
# worker, about 4 s of a suite's CPU. Before the workers start, so that they and every
# pytest the suite starts inherit it; the caches go where Python puts them (ignored by git).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

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
