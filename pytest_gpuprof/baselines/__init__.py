"""Baselines: the store at a URL, the choice of a baseline, each test's comparison with it
and the history of a machine's runs, used alike by the pytest layer and by ``gpuprof``."""
