"""The baseline store: one folder or bucket that every runner saves to and compares with
(``--gpu-storage=URL``, through fsspec: a folder, ``file://``, ``s3://``, ``gs://``,
``az://``, ``memory://``).

Under the store's root, a prefix per machine id::

    <machine-id>/<NAME>@<created>@<run-id>@<random>.json   a saved run, or one shard of it
    <machine-id>/_index/<created>@<random>.json            packs of summaries (read first)
    <machine-id>/NNNN_NAME.json                             saved by earlier versions, still read

A save is one new object whose key no other writer can take (its time, run id and a
random suffix), written whole or not at all; nothing is read, modified and written back.
Order is the store's own: when it wrote each record (the object's modification time, from
its listing), never a date the record states; the record's ``created`` breaks a tie (an
object store that dates to the second). A record that says it was created well after the
store wrote it (a runner whose clock runs ahead, or a crafted file) is ordered by the
store's time and named (``doubtful``). A pack holds the summaries (name, time, commit,
run id, whether accepted, and each test's samples of the default metrics) of records
already read, so listing and reading cost grows with one machine's baselines and mostly
with the records saved since the last pack, not the whole store.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from pytest_gpuprof.baselines.choice import NoBaseline, choose, to_prune
from pytest_gpuprof.baselines.reach import (
    StoreError,
    check_url,
    deadline_s,
    fs_options,
    is_url,
    reason,
    timeouts,
    within,
    written_at,
)
from pytest_gpuprof.baselines.records import (
    BaselineError,
    NewerSchema,
    check_name,
    decoded,
    parse,
    shown,
)
from pytest_gpuprof.baselines.reference import Reference
from pytest_gpuprof.baselines.summary import Summary, epoch, is_record_file
from pytest_gpuprof.output.files import STALE_TMP_S, clear_partial, json_text, written

T = TypeVar("T")

# loose records (saved since the last pack) beyond which a reader writes a new pack
PACK_AT = 64
INDEX = "_index"


class Store:
    """The baselines at one URL: saved, listed, summarised, read, pruned.

    Every call to the storage library ends within ``deadline`` seconds (from the store's
    timeouts, ``deadline_s``), or fails with one line naming the URL and what did not
    answer: a store that did not answer is never read as an empty one."""

    def __init__(self, url: str | Path) -> None:
        self.url = str(url)
        check_url(self.url)
        import fsspec

        scheme = self.url.split("://", 1)[0] if is_url(self.url) else "file"
        options = fs_options(scheme)
        self.deadline = deadline_s(options)
        with self._failing("open"):
            self.fs, root = fsspec.core.url_to_fs(self.url, **options)
        self.root = root.rstrip("/")
        if scheme == "s3":
            # s3fs retries a timed-out call itself, five times over botocore's own attempts:
            # the attempts are botocore's alone, so a stalled endpoint costs what the timeouts say
            self.fs.retries = 1
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        # the records this store's readers skipped because they cannot be read: key, why
        self.damaged: dict[str, str] = {}
        # when the store wrote each record listed (its order), and the records that date
        # themselves well after it: key, why
        self.written: dict[str, float] = {}
        self.doubtful: dict[str, str] = {}

    # --- where things are

    def where(self, key: str) -> str:
        """A record's location as the user named the store (a path, or a URL without credentials)."""
        return f"{shown(self.url).rstrip('/')}/{key}"

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """One call to the storage library, bounded by the deadline, its failure one line."""
        with self._failing(what):
            return within(self.deadline, call)

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """Any failure of the storage library as one line naming the store and what failed."""
        try:
            yield
        except BaselineError:
            raise
        except FileNotFoundError as e:
            raise StoreError(f"{shown(self.url)}: {what}: not found ({reason(e)})") from None
        except PermissionError as e:
            raise StoreError(f"{shown(self.url)}: {what}: access denied ({reason(e)})") from None
        except TimeoutError as e:
            raise StoreError(
                f"{shown(self.url)}: {what}: the store did not answer ({reason(e)}; its timeouts: {timeouts(self.fs)})"
            ) from None
        except Exception as e:  # the libraries' own errors (botocore, aiohttp, gcsfs ...)
            raise StoreError(f"{shown(self.url)}: {what}: {type(e).__name__}: {reason(e)}") from None

    def reach(self) -> None:
        """Whether the store's bucket (or container) answers, asked once before a run that
        saves measures anything: a bucket that does not exist, credentials missing or
        refused, an endpoint that does not answer, each a ``StoreError`` naming the store.
        A local folder is checked by the caller (``settings.checks.check_output``)."""
        if not is_url(self.url) or self.url.startswith(("file://", "memory://")):
            return
        bucket = self.root.split("/", 1)[0]
        with self._failing("reach its bucket"):
            within(self.deadline, lambda: self.fs.ls(bucket))

    # --- writing

    def save(
        self,
        report: dict[str, Any],
        name: str,
        run_id: str | None = None,
        check: Callable[[dict[str, Any], str], None] | None = None,
    ) -> str:
        """``report`` as one new record named ``name``; its location. ``check``: a last
        look at the record before it is stored (the suite's schema check). The partial
        files of saves that died on the way are cleared."""
        check_name(name)
        run = run_id or secrets.token_hex(6)
        created = report.get("created") or dt.datetime.now(dt.timezone.utc).isoformat()
        record = {**report, "name": name, "run_id": run}
        if check is not None:
            check(record, "baseline")
        machine = report["machine"]["id"]
        key = f"{machine}/{name}@{_stamp(created)}@{run}@{secrets.token_hex(4)}.json"
        self._put(key, json_text(record))
        self.clear_partial(machine)
        return self.where(key)

    def _put(self, key: str, text: str) -> None:
        """One object, whole or not at all: a local file by rename, an object store's PUT."""
        if self.local:
            with self._failing(f"write {key}"):
                target = Path(self._path(key))
                with written(target.parent, text) as tmp:
                    os.replace(tmp, target)
            return
        self._call(f"write {key}", lambda: self.fs.pipe_file(self._path(key), text.encode()))

    def clear_partial(self, machine: str, older_than_s: float = STALE_TMP_S) -> list[str]:
        """Remove the partial files that writers killed mid-save left in a local store's
        machine folder (an object store's PUT leaves none); the names removed."""
        if not self.local:
            return []
        folders = [Path(self._path(machine)), Path(self._path(f"{machine}/{INDEX}"))]
        return [name for folder in folders for name in clear_partial(folder, older_than_s)]

    # --- reading

    def _find(self, prefix: str, maxdepth: int | None = None, detail: bool = False) -> Any:
        """The objects below ``prefix`` (``detail``: by path, what the listing says of each).
        A folder that is not there holds none; an object store's listing is asked as it is,
        so that a missing bucket or an endpoint that does not answer is an error, not an
        empty store."""

        def find() -> Any:
            self.fs.invalidate_cache()  # another runner may have saved since
            if self.local and not self.fs.isdir(prefix):
                return {} if detail else []
            if detail:
                return {str(p): info for p, info in self.fs.find(prefix, maxdepth=maxdepth, detail=True).items()}
            return [str(p) for p in self.fs.find(prefix, maxdepth=maxdepth)]

        return within(self.deadline, find)

    def machines(self) -> list[str]:
        """The machine ids that hold records. An object store's listing of the prefixes is
        asked as it is (fsspec's walk of a depth takes a listing that did not answer for an
        empty one)."""
        if self.local:
            with self._failing("list"):
                found = self._find(self.root, maxdepth=2)
            parts = (p[len(self.root) + 1 :].split("/") for p in found)
            return sorted({p[0] for p in parts if len(p) == 2})

        def prefixes() -> list[str]:
            self.fs.invalidate_cache()
            try:
                entries = self.fs.ls(self.root, detail=True)
            except FileNotFoundError:  # nothing saved under the root yet
                return []
            return [str(e["name"]) for e in entries if e.get("type") == "directory"]

        found = self._call("list", prefixes)
        return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in found})

    def machine(self, wanted: str | None) -> str:
        """The machine id whose baselines to read: ``wanted``, or the only one stored."""
        if self.local and not self.fs.isdir(self.root):
            raise BaselineError(f"--storage {self.url}: no such folder (baselines are saved with --gpu-save)")
        if wanted is not None:  # is its prefix there: a fleet's other machines are not listed

            def exists() -> bool:
                self.fs.invalidate_cache()
                return bool(self.fs.exists(self._path(wanted)))

            if not self._call(f"look for {wanted}/", exists):
                stored = self.machines()
                raise NoBaseline(
                    f"no baselines of machine {wanted} under {shown(self.url)}; stored: {stored or 'none'}",
                    empty=True,
                )
            return wanted
        machines = self.machines()
        if len(machines) != 1:
            what = f"baselines of {len(machines)} machines ({', '.join(machines)})" if machines else "no baselines"
            raise BaselineError(f"{shown(self.url)} holds {what}: name one with --machine")
        return machines[0]

    def _listing(self, machine: str) -> list[str]:
        """The keys below one machine's prefix (records, legacy files and packs); when the
        store wrote each is kept (``written``)."""
        prefix = self._path(machine)
        with self._failing(f"list {machine}/"):
            found = self._find(prefix, detail=True)
        keys = {}
        for path, info in found.items():
            if path.endswith(".json"):
                keys[f"{machine}/{path[len(prefix) + 1 :]}"] = written_at(info)
        self.written.update({k: t for k, t in keys.items() if t is not None})
        return sorted(keys)

    def read(self, key: str) -> dict[str, Any]:
        """One record, checked (``records.parse``)."""
        data = self._call(f"read {key}", lambda: self.fs.cat_file(self._path(key)))
        return parse(decoded(data, self.where(key)), self.where(key))

    def read_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """Many records at once, each checked: one round of requests, not one a record."""
        return {key: parse(text, self.where(key)) for key, text in self._texts(keys).items()}

    def _texts(self, keys: list[str], gone_ok: bool = False) -> dict[str, str]:
        """Many objects at once (concurrently where the library can); ``gone_ok``: an object
        removed since it was listed (a pack another reader replaced, a pruned record) is
        left out instead of failing the read."""
        if not keys:
            return {}
        paths = [self._path(k) for k in keys]
        got = self._call(f"read {len(keys)} record(s)", lambda: self.fs.cat(paths, on_error="return"))
        out = {}
        for key in keys:
            value = got.get(self._path(key)) if isinstance(got, dict) else None
            if isinstance(value, FileNotFoundError) and gone_ok:
                continue
            if isinstance(value, BaseException) or value is None:
                why = reason(value) if isinstance(value, BaseException) else "no answer for it"
                raise StoreError(f"{self.where(key)}: cannot read: {why}")
            try:
                out[key] = decoded(value, self.where(key))
            except BaselineError as e:
                if not gone_ok:
                    raise
                self.damaged[key] = str(e)
        return out

    def summaries(self, machine: str) -> list[Summary]:
        """Every record of ``machine``, oldest first: from the packs, and the records saved
        since read (and then packed, where there are many of them and the store is
        writable). A record that cannot be read is summarised as damaged (``damaged``
        names it; a comparison never picks it, ``prune`` removes it); one of a newer
        pytest-gpuprof is left out, untouched."""
        keys = self._listing(machine)
        packs = [k for k in keys if k.startswith(f"{machine}/{INDEX}/")]
        records = {k for k in keys if k not in packs and _is_record(k)}
        known: dict[str, Summary] = {}
        for text in self._texts(packs, gone_ok=True).values():  # a pack replaced since listing: a cache gone
            try:
                for entry in json.loads(text)["summaries"]:
                    known[entry["key"]] = Summary(**entry)
            except (ValueError, KeyError, TypeError, RecursionError):
                continue  # a torn or foreign pack is only a cache: its records are read again
        known = {k: s for k, s in known.items() if k in records}  # pruned ones dropped
        loose = sorted(records - set(known))
        texts = self._texts(loose, gone_ok=True)
        for key in loose:
            if key in texts:
                try:
                    known[key] = Summary.of(key, parse(texts[key], self.where(key)))
                except NewerSchema:
                    continue
                except BaselineError as e:
                    known[key] = Summary.of_damaged(key, str(e))
            elif key in self.damaged:  # not text at all
                known[key] = Summary.of_damaged(key, self.damaged[key])
        self.damaged.update({s.key: s.damaged for s in known.values() if s.damaged})
        if len(loose) >= PACK_AT:
            self._pack(machine, known.values(), packs)
        dated = [replace(s, stored=self.written.get(s.key, s.stored)) for s in known.values()]
        for s in dated:
            ahead = epoch(s.created) - (s.stored if s.stored is not None else epoch(s.created))
            if ahead > FUTURE_SLACK_S:
                self.doubtful[s.key] = (
                    f"says it was created {s.created[:19]}, {ahead / 3600:.1f} h after the store wrote it: "
                    "ordered by when the store wrote it"
                )
        return sorted(dated, key=Summary.order)

    def _pack(self, machine: str, summaries: Iterable[Summary], old: list[str]) -> None:
        """One new pack of ``summaries``; the packs it covers removed. A store this runner
        may only read keeps its records loose: the pack is a cache, never needed."""
        stamp = _stamp(dt.datetime.now(dt.timezone.utc).isoformat())
        text = json.dumps({"kind": "gpuprof-index", "summaries": [s.as_json() for s in summaries]})
        try:
            self._put(f"{machine}/{INDEX}/{stamp}@{secrets.token_hex(4)}.json", text)
            for key in old:
                with contextlib.suppress(Exception):
                    self._call(f"remove {key}", lambda key=key: self.fs.rm_file(self._path(key)))  # type: ignore[misc]
        except StoreError:
            return

    # --- choosing a baseline

    def reference(self, machine: str, wanted: str | None, pooled: int = 1) -> Reference:
        """What a comparison reads: each test's newest accepted record (of ``wanted``'s name,
        where given) that holds it, or its ``pooled`` newest ones (``choice.choose``)."""
        chosen = choose(
            self.summaries(machine),
            wanted,
            pooled,
            machine=machine,
            url=shown(self.url),
            others=lambda: [m for m in self.machines() if m != machine],
            doubtful=self.doubtful,
        )
        return Reference(self, chosen.accepted, pooled, self.where(chosen.newest.key), chosen.why, chosen.newest)

    def reference_any_machine(self, wanted: str | None, pooled: int = 1) -> Reference:
        """``reference`` on the machine whose newest accepted baseline (of ``wanted``'s name)
        is the newest of the store's: after a driver update, the machine id changes."""
        best: tuple[tuple[float, str, str], str] | None = None
        for machine in self.machines():
            for s in self.summaries(machine):
                if s.refused is None and (wanted is None or s.name == wanted) and (best is None or s.order() > best[0]):
                    best = (s.order(), machine)
        if best is None:
            what = f"named {wanted!r} " if wanted else ""
            raise NoBaseline(f"no accepted baseline {what}of any machine under {shown(self.url)}")
        return self.reference(best[1], wanted, pooled)

    def prune(self, machine: str, keep: int, name: str | None = None) -> list[str]:
        """Remove each name's records beyond its ``keep`` newest runs (a run's shards are one
        run), and every damaged record; the keys removed. The summaries of what remains are
        packed again first, so no pack names a removed record. The partial files of writers
        that died are cleared."""
        summaries = self.summaries(machine)
        removed = to_prune(summaries, keep, name)
        self.clear_partial(machine)
        if not removed:
            return []
        kept = [s for s in summaries if s.key not in set(removed)]
        packs = [k for k in self._listing(machine) if k.startswith(f"{machine}/{INDEX}/")]
        self._pack(machine, kept, packs)
        self._call(f"remove {len(removed)} record(s)", lambda: self.fs.rm([self._path(k) for k in removed]))
        return removed


# how far a record's own date may run ahead of the store's before it is named: clocks of a
# fleet's runners disagree by seconds, a runner's clock set a year ahead by far more
FUTURE_SLACK_S = 300.0


def _is_record(key: str) -> bool:
    file = key.rsplit("/", 1)[-1]
    return key.count("/") == 1 and is_record_file(file)


def _stamp(created: str) -> str:
    """A record's ``created`` as part of its key: sortable, UTC, to the microsecond."""
    try:
        when = dt.datetime.fromisoformat(created).astimezone(dt.timezone.utc)
    except ValueError:
        when = dt.datetime.now(dt.timezone.utc)
    return when.strftime("%Y%m%dT%H%M%S.%fZ")
