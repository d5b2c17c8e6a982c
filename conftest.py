import os
import sys

import pytest
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


@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than xdist counts cores. Part of the suite waits on what
    it starts (pytest runs in processes of their own, servers, a browser) or sleeps; a third
    worker on two cores fills that time (44.3-45.1 s with two workers, 42.8-43.9 s with
    three, 2026-12-05). A number in ``PYTEST_XDIST_AUTO_NUM_WORKERS`` is kept as given."""
    cores = yield
    return cores if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else cores + 1
