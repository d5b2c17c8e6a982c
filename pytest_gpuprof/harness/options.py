"""Every setting once: its flag, its ``[tool.gpuprof]`` key, its kind, default, range and help.

The pytest options, the keys ``[tool.gpuprof]`` accepts and how each is checked, the
defaults ``Settings`` starts from, the CLI's shared flags and the options table of the
README (``tests/harness/test_options.py`` holds it equal to this one) all come from ``TABLE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import Metric
from pytest_gpuprof.measure import ROUNDS, WARMUP
from pytest_gpuprof.verdict.validate import Number

SWITCH = ("on", "off")
# set in the environment of a fresh run that confirms a regression (``harness.reruns``): it
# measures and reports, nothing else
CONFIRMING = "PYTEST_GPUPROF_CONFIRMING"


class Option(NamedTuple):
    flag: str
    help: str
    # the key of [tool.gpuprof] that sets it too, where one does
    key: str | None = None
    # what a run gets where neither the command line nor the file says (None: nothing)
    default: Any = None
    choices: tuple[str, ...] | None = None
    # a numeric setting: its type and range
    number: Number | None = None
    metavar: str | None = None
    # a flag without a value; given several times, the values add up
    switch: bool = False
    repeat: bool = False
    # a budget key of every measured test, given on the command line (``--gpu-min-utilization``)
    budget: str | None = None

    def argparse(self) -> dict[str, Any]:
        """Its ``addoption`` keywords. Values default to None (False for a switch): the
        file's value, or the table's default, is taken where the command line gave none."""
        if self.switch:
            return {"action": "store_true", "help": self.help.replace("%", "%%")}
        # argparse formats help with %: a literal one is %%
        kwargs: dict[str, Any] = {"default": None, "help": (self.help + self.shown_default()).replace("%", "%%")}
        if self.choices:
            kwargs["choices"] = self.choices
        elif self.number is not None:
            kwargs["type"] = int if self.number.whole else float
        if self.metavar:
            kwargs["metavar"] = self.metavar
        if self.repeat:
            kwargs["action"] = "append"
        return kwargs

    def shown_default(self) -> str:
        return "" if self.default is None else f" (default {self.default})"


TABLE: tuple[Option, ...] = (
    Option("--gpu-budget", "enforce GPU budgets: a breach fails the test", switch=True),
    Option(
        "--gpu-budget-file",
        "a TOML budget, schema of [tool.gpuprof.budget]; over pyproject.toml, under markers",
        metavar="FILE",
    ),
    Option("--gpu-backend", "the device's backend", key="backend", default="auto", choices=("auto", "cuda", "host")),
    Option(
        "--gpu-host-clock",
        "host backend: real time, or virtual time in which kernels and copies take exactly what they "
        "ask and host code takes none (deterministic tests)",
        key="host_clock",
        default="real",
        choices=("real", "virtual"),
    ),
    Option(
        "--gpu-devices",
        "under pytest-xdist, the GPUs the workers go round: positions in the caller's CUDA_VISIBLE_DEVICES "
        "(default all); each worker sees its one GPU as device 0",
        metavar="all|N,M,...",
    ),
    Option(
        "--gpu-rounds",
        "measured rounds of gpuprof.measure",
        key="rounds",
        default=ROUNDS,
        number=Number(1, 10_000, whole=True),
        metavar="N",
    ),
    Option(
        "--gpu-warmup",
        "unmeasured warm-up rounds",
        key="warmup",
        default=WARMUP,
        number=Number(0, 10_000, whole=True),
        metavar="N",
    ),
    Option(
        "--gpu-device",
        "CUDA device index",
        key="device",
        default=0,
        number=Number(0, 1_024, whole=True),
        metavar="N",
    ),
    Option("--gpu-report", "write the JSON report (schema 1) here", metavar="PATH"),
    Option("--gpu-trace", "one Chrome-trace/Perfetto JSON per test", metavar="DIR"),
    Option("--gpu-html", "one self-contained HTML report with timelines", metavar="PATH"),
    Option("--gpu-save", "store this run as a baseline named NAME", metavar="NAME"),
    Option(
        "--gpu-compare",
        "compare with this machine's newest baseline (latest), its newest one named NAME, the last K of NAME pooled (NAME~K), or the file PATH",
        metavar="latest|NAME|NAME~K|PATH",
    ),
    Option(
        "--gpu-compare-fail",
        "fail a test whose metric regressed beyond this, clearly over the rounds: utilization:-2pt,wall_ms:+10%",
        metavar="EXPR[,EXPR...]",
        repeat=True,
    ),
    Option(
        "--gpu-compare-undecided",
        "a gated test the comparison cannot decide (its threshold within the noise it measured): warn names "
        "and counts it and passes; fail fails it as GPU UNDECIDED",
        key="compare_undecided",
        default="warn",
        choices=("warn", "fail"),
    ),
    Option(
        "--gpu-compare-confirm",
        "run a test the gate finds regressed again N times, each a fresh pytest process, before it fails: "
        "a regression one of them does not repeat is undecided, not a failure (0: off)",
        key="compare_confirm",
        default=1,
        number=Number(0, 20, whole=True),
        metavar="N",
    ),
    Option("--gpu-compare-any-machine", "compare with a baseline of another machine id", switch=True),
    Option(
        "--gpu-storage",
        "where baselines are kept: a folder, file://, s3://, gs://, az:// or memory:// (fsspec); a relative "
        "folder of [tool.gpuprof] and the default are at pytest's rootdir, whatever the current folder",
        key="storage",
        default=".gpuprof",
        metavar="URL",
    ),
    Option(
        "--gpu-run-id",
        "the run a --gpu-save belongs to; the shards of one run share it (default: the CI's run id)",
        metavar="ID",
    ),
    Option("--gpu-no-cupti", "do not use CUPTI; truth falls back to CUDA events", switch=True),
    Option("--gpu-no-nvml", "do not sample NVML", switch=True),
    Option(
        "--gpu-nvml-interval",
        "NVML poll interval, ms",
        key="nvml_interval",
        default=20.0,
        number=Number(1, 60_000),
        metavar="MS",
    ),
    Option("--gpu-nvtx", "NVTX ranges of every thread as steps (CUPTI only)", key="nvtx", default="on", choices=SWITCH),
    Option(
        "--gpu-sample",
        "sample the host's Python stacks to name the code behind unattributed idle",
        key="sample",
        default="on",
        choices=SWITCH,
    ),
    Option(
        "--gpu-exclusive",
        "auto: a test that uses the GPU holds it alone among this plugin's processes (xdist workers, "
        "other pytest runs on the host); its wait is waited_ms, outside its windows",
        key="exclusive",
        default="auto",
        choices=("auto", "off"),
    ),
    Option(
        "--gpu-lock-timeout",
        "how long a run waits for a GPU another process holds before the test errors naming the holder "
        "(the wait is said at once, with the holder's pid, user and test)",
        key="lock_timeout",
        default=600,
        number=Number(0, 86_400, whole=False),
        metavar="SECONDS",
    ),
    Option(
        "--gpu-children",
        "trace the device work of the processes a test starts (Python ones by a start-up hook, native ones by "
        "CUPTI's injection library) into its windows (CUPTI only)",
        key="children",
        default="on",
        choices=SWITCH,
    ),
    Option(
        "--gpu-disable",
        "run the tests and their fixtures' code once, measuring and judging nothing (the everyday loop); "
        "reading a figure skips the test",
        switch=True,
    ),
    Option("--gpu-skip", "skip the tests that use the plugin (its fixtures, gpu_budget or gpu markers)", switch=True),
    Option("--gpu-only", "run only the tests that use the plugin; the others are skipped", switch=True),
    Option(
        "--gpu-autosave",
        "save this run as a baseline named after the commit and the time (COMMIT_YYYYMMDDTHHMMSS)",
        switch=True,
    ),
    Option(
        "--gpu-columns",
        "the terminal table's columns, in order: test, wall_ms, utilization, reported_utilization, overhead_ms, "
        "cause, verdict or any metric's path (kernel_ms, steps.upload.idle_ms, memory.peak_bytes...)",
        metavar="COL[,COL...]",
    ),
    Option(
        "--gpu-sort",
        "order the terminal table by a metric, worst first (name: by test id); default breaches first, "
        "then the largest kernel-idle",
        metavar="METRIC|name",
    ),
    Option(
        "--gpu-group-by",
        "the terminal table in groups: by module, class, param (the parameters' id) or name (the function)",
        choices=("module", "class", "param", "name"),
    ),
    Option(
        "--gpu-memory-top",
        "the N places in each measured test's code that held the most device memory at its peak, in the "
        "summary, the JSON and a failing test's report (records where each allocation was made: PyTorch's, "
        "CuPy's and the host backend's)",
        key="memory_top",
        default=0,
        number=Number(0, 1_000, whole=True),
        metavar="N",
    ),
    Option("--gpu-csv", "a CSV file: one row per test and window, the metrics' paths as columns", metavar="PATH"),
    Option(
        "--gpu-summary",
        "rows of the terminal table: breaches and failures first, then the largest kernel-idle; the rest "
        "counted in one line",
        default="20",
        metavar="N|all",
    ),
)


def _budget_flag(key: str, metric: Metric) -> Option:
    """A test-level budget key as a flag: ``min_utilization`` is ``--gpu-min-utilization``."""
    kind = "SIZE" if metric.unit == "bytes" else ("FRACTION" if metric.unit == "fraction" else metric.unit.upper())
    return Option(
        "--gpu-" + key.replace("_", "-"),
        f"budget: {key} of every measured test ({metric.meaning}); over the files, under markers",
        metavar=kind,
        budget=key,
    )


# the test-level budget keys (``Budget.KEYS``, without importing the budget's module)
TABLE += tuple(_budget_flag(key, metric) for key, metric in descriptors.limits("window", "memory").items())
BUDGET_FLAGS: tuple[Option, ...] = tuple(o for o in TABLE if o.budget is not None)
BY_FLAG: Mapping[str, Option] = {o.flag: o for o in TABLE}
# what a run gets where nothing says otherwise, by flag (``--gpu-rounds``: 5)
DEFAULT: Mapping[str, Any] = {o.flag: o.default for o in TABLE}
