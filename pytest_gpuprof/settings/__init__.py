"""Every setting once, without pytest: the table of options and ``[tool.gpuprof]`` keys
(``options``), how each value becomes its ``Settings`` field (``convert``) and the checks
they share (``checks``: ranges, output paths, the TOML files read). The pytest layer
(``harness.config``) builds a run's ``Settings`` from them; the CLI shares their flags."""
