"""What the store knows of a record without reading it whole (``Summary``): its name, dates,
run, commit, whether a comparison may pick it, and each test's samples of the default
metrics; and how a record's file is named."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from pytest_gpuprof.baselines.records import clean, entry_problem, not_accepted

# the default metrics of ``gpuprof history``, kept in each summary
SUMMARY_METRICS = ("wall_ms", "kernel_ms", "utilization")
RECORD = re.compile(
    r"^(?P<name>[A-Za-z0-9_.\-]+)@(?P<stamp>\d{8}T\d{6}\.\d{6}Z)@(?P<run>[A-Za-z0-9_.\-]+)@[0-9a-f]+\.json$"
)
_LEGACY = re.compile(r"^(\d{4})_(.+)\.json$")


def is_record_file(file: str) -> bool:
    """A saved run's file name, or one of earlier versions."""
    return bool(RECORD.match(file) or _LEGACY.match(file))


@dataclass(frozen=True, slots=True)
class Summary:
    """What the store's readers need of one record without reading it whole."""

    key: str  # below the root: <machine>/<file>
    name: str
    created: str
    run_id: str
    commit: str = ""
    branch: str = ""
    refused: str | None = None  # why no comparison may pick it (``not_accepted``)
    tests: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # nodeid: metric: samples
    problems: dict[str, str] = field(default_factory=dict)  # nodeid: why its entry is unusable
    damaged: str | None = None  # why the record cannot be read at all (``prune`` removes it)
    stored: float | None = None  # when the store wrote it (seconds since the epoch), from its listing
    # the tests measured inside hypothesis examples: their figures are the last example's,
    # whose sizes were drawn (``history`` charts no trend of them)
    drawn: list[str] = field(default_factory=list)

    def order(self) -> tuple[float, str, str]:
        """The store's write order; the record's own date only breaks a tie."""
        return (self.stored if self.stored is not None else epoch(self.created), self.created, self.key)

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def of_damaged(cls, key: str, why: str) -> Summary:
        """A record that cannot be read: named and dated by its key, never a baseline."""
        file = key.rsplit("/", 1)[-1]
        match = RECORD.match(file)
        created = ""
        if match:
            with contextlib.suppress(ValueError):
                created = dt.datetime.strptime(match["stamp"], "%Y%m%dT%H%M%S.%fZ").isoformat() + "+00:00"
        return cls(key, name_of(file), created, match["run"] if match else "", refused=why, damaged=why)

    @classmethod
    def of(cls, key: str, record: dict[str, Any]) -> Summary:
        from pytest_gpuprof.verdict.samples import samples_of

        name = name_of(key.rsplit("/", 1)[-1])
        tests: dict[str, dict[str, list[float]]] = {}
        problems = {}
        for t in record["tests"]:
            problem = entry_problem(t) if "crashed" not in t else None
            if problem is not None:
                problems[t["nodeid"]] = problem
            tests[t["nodeid"]] = {} if problem else {m: v for m in SUMMARY_METRICS if (v := samples_of(t, m))}
        created = record.get("created", "")
        return cls(
            key=key,
            name=name,
            created=created if isinstance(created, str) else "",
            run_id=clean(str(record.get("run_id", ""))),
            commit=clean(str(record.get("commit", ""))),
            branch=clean(str(record.get("branch", ""))),
            refused=not_accepted(record),
            tests=tests,
            problems=problems,
            drawn=[t["nodeid"] for t in record["tests"] if t.get("examples")],
        )


def epoch(created: str) -> float:
    """A record's ``created`` in seconds since the epoch (0 where it cannot be read)."""
    try:
        when = dt.datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def name_of(file: str) -> str:
    """A record's name from its file name (``NAME@...`` or a legacy ``NNNN_NAME.json``)."""
    match = RECORD.match(file)
    if match:
        return match["name"]
    legacy = _LEGACY.match(file)
    return legacy[2] if legacy else file
