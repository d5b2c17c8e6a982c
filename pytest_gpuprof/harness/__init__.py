"""The pytest layer: what runs around each test, between pytest's hooks (``plugin``) and
the layers below (``capture``, ``analysis``, ``verdict``, ``output``, ``baselines``,
``measure``, ``settings``).

- the settings: ``config`` (``Settings``, built at start-up from ``settings.options.TABLE``);
- the public fixtures' objects come from ``measure`` (the engine, no pytest), built here
  with a run's settings;
- the session: ``session`` (around each test), ``runtime`` (the backend, device and
  header), ``wrap_up`` (what a run leaves behind); the baseline and each test's comparison
  come from ``baselines.gate``;
- ``hookspecs``: the hooks a project implements.
"""
