"""The measuring engine, without pytest: a test's steps and regions (``spans``), each window
cut and judged (``windows``, ``drained``), the ``gpuprof`` fixture's object (``profiler``),
the ``gpu_workload`` fixture's object (``workload``), hypothesis examples (``confirm``) and
what a test sees raised (``errors``). The pytest layer (``harness``) builds them with a
run's settings; ``benchmarks/`` use them as they are.
"""

# a measure()'s rounds and warm-up rounds where neither the call nor the run says
ROUNDS = 5
WARMUP = 1
