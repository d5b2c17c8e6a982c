"""What a run compares against: each test's baseline entry, from the newest accepted record
of the store that holds it, or from one report given by its path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_gpuprof.verdict.entry import Entry

__all__ = ["Held", "Records", "Reference", "Source", "pool", "test_of"]


class Records(Protocol):
    """Where the records are (a store): each read by its key, each key's location said."""

    def read(self, key: str) -> dict[str, Any]: ...

    def where(self, key: str) -> str: ...


class Held(Protocol):
    """A stored record as listed (a store's summary of it): its key and the tests it holds."""

    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def tests(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Source:
    """Which baseline record a test's entry came from: the JSON's ``baseline``."""

    where: str
    name: str
    created: str
    commit: str
    branch: str
    pooled: int
    environment: Mapping[str, Any] = field(default_factory=dict)  # what else changes kernels, then

    @property
    def record(self) -> dict[str, Any]:
        return {
            "key": self.where,
            "name": self.name,
            "created": self.created,
            "commit": self.commit,
            "branch": self.branch,
            "pooled": self.pooled,
        }


@dataclass
class Reference:
    """Each test's baseline entry: from the newest accepted record that holds it (a shard
    that lacks a test leaves it to the record that has it), pooled over ``pooled`` of them."""

    store: Records | None
    accepted: tuple[Held, ...]  # newest first
    pooled: int
    where: str  # the newest record's location: the compare line names it
    why: str
    newest: Held | None
    _records: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of_report(cls, report: dict[str, Any], where: str) -> Reference:
        """A single report given by its path: every test from it."""
        ref = cls(None, (), 1, where, "the file given", None)
        ref._records[where] = report
        return ref

    @property
    def newest_record(self) -> dict[str, Any]:
        """The newest record (whose machine a comparison checks)."""
        if self.store is None:
            return self._records[self.where]
        assert self.newest is not None
        return self._record(self.newest.key)

    def _record(self, key: str) -> dict[str, Any]:
        if key not in self._records:
            assert self.store is not None
            self._records[key] = self.store.read(key)
        return self._records[key]

    def _source(self, record: dict[str, Any], where: str, name: str, pooled: int) -> Source:
        from pytest_gpuprof.baselines.records import clean

        def text(key: str) -> str:
            return clean(str(record.get(key) or ""))

        machine = record.get("machine")
        environment = machine.get("environment") if isinstance(machine, dict) else None
        environment = (
            {clean(str(k)): clean(str(v)) for k, v in environment.items()} if isinstance(environment, dict) else {}
        )
        return Source(where, clean(name), text("created"), text("commit"), text("branch"), pooled, environment)

    def entry(self, nodeid: str) -> tuple[Entry, Source] | None:
        """The test's entry and which record it came from (how many runs it pools);
        ``None`` for a test no accepted baseline holds."""
        if self.store is None:
            report = self._records[self.where]
            test = test_of(report, nodeid)
            name = str(report.get("name") or self.where)
            return None if test is None else (test, self._source(report, self.where, name, 1))
        holding = [s for s in self.accepted if nodeid in s.tests][: self.pooled]
        if not holding:
            return None
        entries = [e for s in holding if (e := test_of(self._record(s.key), nodeid)) is not None]
        if not entries:
            return None
        first = holding[0]
        source = self._source(self._record(first.key), self.store.where(first.key), first.name, len(entries))
        return (entries[0] if len(entries) == 1 else pool(entries)), source

    def history(self, nodeid: str, runs: int) -> list[Entry]:
        """The test's entries in the newest ``runs`` accepted runs of the name of the record
        it is compared with (newest first): what the spread between runs is learnt from. A
        single report is one run."""
        return [entry for _, entry in self.history_of(nodeid, runs)]

    def history_of(self, nodeid: str, runs: int) -> list[tuple[str, Entry]]:
        """``history`` with each entry's location (a stored record's path or URL)."""
        if self.store is None:
            test = test_of(self._records[self.where], nodeid)
            return [] if test is None else [(self.where, test)]
        holding = [s for s in self.accepted if nodeid in s.tests]
        if not holding:
            return []
        same = [s for s in holding if s.name == holding[0].name][:runs]
        return [(self.store.where(s.key), e) for s in same if (e := test_of(self._record(s.key), nodeid)) is not None]


def pool(entries: list[Entry]) -> Entry:
    """One baseline entry of several runs of a test: the newest's figures, every round's
    samples of all of them."""
    rounds: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for path, summary in (entry.get("rounds") or {}).items():
            if isinstance(summary, dict) and isinstance(summary.get("samples"), list):
                rounds.setdefault(path, {"samples": []})["samples"].extend(summary["samples"])
    return {**entries[0], "rounds": rounds, "pooled": len(entries)}


def test_of(report: dict[str, Any], nodeid: str) -> Entry | None:
    """The entry of test ``nodeid`` in ``report``, if it holds one."""
    return next((t for t in report["tests"] if t.get("nodeid") == nodeid), None)
