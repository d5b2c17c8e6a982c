import pytest


@pytest.fixture(autouse=True)
def virtual_clock(request, monkeypatch):
    """Every pytest session a test starts runs the host backend on the virtual clock, so
    that its figures do not depend on how busy this machine is; and it keeps the plugin's
    budget warnings as warnings, whatever this run's warning filters (-W error)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # which clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv(
            "PYTEST_ADDOPTS", "--gpu-host-clock=virtual -W default::pytest_gpuprof.session.GpuBudgetWarning"
        )
