import pytest


@pytest.fixture
def plugin_args(pytestconfig):
    """Arguments that load the plugin in a child pytest, installed or not."""
    if pytestconfig.pluginmanager.has_plugin("gpuprof"):
        return []
    return ["-p", "pytest_gpuprof.plugin"]
