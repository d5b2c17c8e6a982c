"""Every setting once: its flag, its ``[tool.gpuprof]`` key, its kind, default, range, help,
the ``Settings`` field it sets and how (``convert``), and what it cannot go with.

The pytest options, the keys ``[tool.gpuprof]`` accepts and how each is checked, the
``Settings`` a run gets (``config.Settings.from_pytest_config`` reads the table row by row),
the conflicts refused, the CLI's shared flags and the options table of the README
(``tests/harness/test_options.py`` holds it equal to this one) all come from ``TABLE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pytest_gpuprof.analysis import descriptors
from pytest_gpuprof.analysis.descriptors import Metric
from pytest_gpuprof.measure import ROUNDS, WARMUP
from pytest_gpuprof.settings import convert as c
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
    # the ``Settings`` field it sets (None: read by another row's converter or by the run's
    # budget), and how its value becomes the field's (None: as given)
    field: str | None = None
    convert: c.Convert | None = None
    # the flags it cannot be given with, and why
    conflicts: tuple[str, ...] = ()
    why: str = ""

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


# what a run that measures nothing, or only part of the suite, cannot be: a baseline or a gate
GATE = ("--gpu-save", "--gpu-autosave", "--gpu-compare", "--gpu-compare-fail")

TABLE: tuple[Option, ...] = (
    Option(
        "--gpu-budget", "enforce GPU budgets: a breach fails the test", switch=True, field="enforce", convert=c.switch
    ),
    Option(
        "--gpu-budget-file",
        "a TOML budget, schema of [tool.gpuprof.budget]; over pyproject.toml, under markers",
        metavar="FILE",
    ),
    Option(
        "--gpu-backend",
        "the device's backend",
        key="backend",
        default="auto",
        choices=("auto", "cuda", "host"),
        field="backend",
    ),
    Option(
        "--gpu-host-clock",
        "host backend: real time, or virtual time in which kernels and copies take exactly what they "
        "ask and host code takes none (deterministic tests)",
        key="host_clock",
        default="real",
        choices=("real", "virtual"),
        field="host_clock",
    ),
    Option(
        "--gpu-devices",
        "under pytest-xdist, the GPUs the workers go round: positions in the caller's CUDA_VISIBLE_DEVICES "
        "(default all); each worker sees its one GPU as device 0",
        metavar="all|N,M,...",
        field="devices",
        convert=c.devices,
    ),
    Option(
        "--gpu-rounds",
        "measured rounds of gpuprof.measure",
        key="rounds",
        default=ROUNDS,
        number=Number(1, 10_000, whole=True),
        metavar="N",
        field="rounds",
        convert=c.whole,
    ),
    Option(
        "--gpu-warmup",
        "unmeasured warm-up rounds",
        key="warmup",
        default=WARMUP,
        number=Number(0, 10_000, whole=True),
        metavar="N",
        field="warmup",
        convert=c.whole,
    ),
    Option(
        "--gpu-device",
        "CUDA device index",
        key="device",
        default=0,
        number=Number(0, 1_024, whole=True),
        metavar="N",
        field="device",
        convert=c.whole,
    ),
    Option(
        "--gpu-report",
        "write the JSON report (schema 1) here",
        metavar="PATH",
        field="report",
        convert=c.file_path("--gpu-report"),
    ),
    Option(
        "--gpu-trace",
        "one Chrome-trace/Perfetto JSON per test",
        metavar="DIR",
        field="trace",
        convert=c.file_path("--gpu-trace", folder=True),
    ),
    Option(
        "--gpu-html",
        "one self-contained HTML report with timelines",
        metavar="PATH",
        field="html",
        convert=c.file_path("--gpu-html"),
    ),
    Option(
        "--gpu-save",
        "store this run as a baseline named NAME",
        metavar="NAME",
        field="save",
        convert=c.baseline_name,
        conflicts=("--gpu-autosave",),
        why="--gpu-autosave names the baseline itself",
    ),
    Option(
        "--gpu-compare",
        "compare with this machine's newest baseline (latest), its newest one named NAME, the last K of NAME pooled (NAME~K), or the file PATH",
        metavar="latest|NAME|NAME~K|PATH",
        field="compare",
        convert=c.compare,
    ),
    Option(
        "--gpu-compare-fail",
        "fail a test whose metric regressed beyond this, clearly over the rounds: utilization:-2pt,wall_ms:+10%",
        metavar="EXPR[,EXPR...]",
        repeat=True,
        field="compare_fail",
        convert=c.thresholds,
    ),
    Option(
        "--gpu-compare-undecided",
        "a gated test the comparison cannot decide (its threshold within the noise it measured): warn names "
        "and counts it and passes; fail fails it as GPU UNDECIDED",
        key="compare_undecided",
        default="warn",
        choices=("warn", "fail"),
        field="compare_undecided",
    ),
    Option(
        "--gpu-compare-confirm",
        "run a test the gate finds regressed again N times, each a fresh pytest process, before it fails: "
        "a regression one of them does not repeat is undecided, not a failure (0: off)",
        key="compare_confirm",
        default=1,
        number=Number(0, 20, whole=True),
        metavar="N",
        field="compare_confirm",
        convert=c.whole,
    ),
    Option(
        "--gpu-compare-any-machine",
        "compare with a baseline of another machine id",
        switch=True,
        field="compare_any_machine",
        convert=c.switch,
    ),
    Option(
        "--gpu-storage",
        "where baselines are kept: a folder, file://, s3://, gs://, az:// or memory:// (fsspec); a relative "
        "folder of [tool.gpuprof] and the default are at pytest's rootdir, whatever the current folder",
        key="storage",
        default=".gpuprof",
        metavar="URL",
        field="storage",
        convert=c.storage,
    ),
    Option(
        "--gpu-run-id",
        "the run a --gpu-save belongs to; the shards of one run share it (default: the CI's run id)",
        metavar="ID",
        field="run_id",
        convert=c.run_id,
    ),
    Option(
        "--gpu-no-cupti",
        "do not use CUPTI; truth falls back to CUDA events",
        switch=True,
        field="cupti",
        convert=c.not_given,
    ),
    Option("--gpu-no-nvml", "do not sample NVML", switch=True, field="nvml", convert=c.not_given),
    Option(
        "--gpu-nvml-interval",
        "NVML poll interval, ms",
        key="nvml_interval",
        default=20.0,
        number=Number(1, 60_000),
        metavar="MS",
        field="nvml_interval_ms",
        convert=c.real,
    ),
    Option(
        "--gpu-nvtx",
        "NVTX ranges of every thread as steps (CUPTI only)",
        key="nvtx",
        default="on",
        choices=SWITCH,
        field="nvtx",
        convert=c.on,
    ),
    Option(
        "--gpu-sample",
        "sample the host's Python stacks to name the code behind unattributed idle",
        key="sample",
        default="on",
        choices=SWITCH,
        field="sample",
        convert=c.on,
    ),
    Option(
        "--gpu-exclusive",
        "auto: a test that uses the GPU holds it alone among this plugin's processes (xdist workers, "
        "other pytest runs on the host); its wait is waited_ms, outside its windows",
        key="exclusive",
        default="auto",
        choices=("auto", "off"),
        field="exclusive",
        convert=c.auto,
    ),
    Option(
        "--gpu-lock-timeout",
        "how long a run waits for a GPU another process holds before the test errors naming the holder "
        "(the wait is said at once, with the holder's pid, user and test)",
        key="lock_timeout",
        default=600,
        number=Number(0, 86_400, whole=False),
        metavar="SECONDS",
        field="lock_timeout_s",
        convert=c.real,
    ),
    Option(
        "--gpu-children",
        "trace the device work of the processes a test starts (Python ones by a start-up hook, native ones by "
        "CUPTI's injection library) into its windows (CUPTI only)",
        key="children",
        default="on",
        choices=SWITCH,
        field="children",
        convert=c.on,
    ),
    Option(
        "--gpu-disable",
        "run the tests and their fixtures' code once, measuring and judging nothing (the everyday loop); "
        "reading a figure skips the test",
        switch=True,
        field="disabled",
        convert=c.switch,
        conflicts=("--gpu-skip", "--gpu-only", *GATE),
        why="--gpu-disable measures nothing, so nothing can be saved, compared or chosen by it",
    ),
    Option(
        "--gpu-skip",
        "skip the tests that use the plugin (its fixtures, gpu_budget or gpu markers)",
        switch=True,
        conflicts=("--gpu-only", *GATE),
        why="--gpu-skip runs no test that measures anything",
    ),
    Option(
        "--gpu-only",
        "run only the tests that use the plugin; the others are skipped",
        switch=True,
        conflicts=GATE,
        why="--gpu-only runs part of the suite: such a run is no baseline, and a gate on it passes the rest unseen",
    ),
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
        field="columns",
        convert=c.columns,
    ),
    Option(
        "--gpu-sort",
        "order the terminal table by a metric, worst first (name: by test id); default breaches first, "
        "then the largest kernel-idle",
        metavar="METRIC|name",
        field="sort",
        convert=c.sort,
    ),
    Option(
        "--gpu-group-by",
        "the terminal table in groups: by module, class, param (the parameters' id) or name (the function)",
        choices=("module", "class", "param", "name"),
        field="group_by",
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
        field="memory_top",
        convert=c.whole,
    ),
    Option(
        "--gpu-csv",
        "a CSV file: one row per test and window, the metrics' paths as columns",
        metavar="PATH",
        field="csv",
        convert=c.file_path("--gpu-csv"),
    ),
    Option(
        "--gpu-summary",
        "rows of the terminal table: breaches and failures first, then the largest kernel-idle; the rest "
        "counted in one line",
        default="20",
        metavar="N|all",
        field="summary_rows",
        convert=c.rows,
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
