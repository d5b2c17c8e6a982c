import contextlib

import pytest

# PyTorch cannot be imported twice in one process (its C functions keep their docstrings),
# and pytester drops the modules a test imported when the test ends: import it once here,
# before any test, where it is installed
with contextlib.suppress(ImportError):
    import torch  # noqa: F401


@pytest.fixture
def plugin_args(pytestconfig):
    """Arguments that load the plugin in a child pytest, installed or not."""
    if pytestconfig.pluginmanager.has_plugin("gpuprof"):
        return []
    return ["-p", "pytest_gpuprof.plugin"]
