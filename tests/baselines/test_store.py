"""The baseline store at a URL: save, compare, shards, pooling, history, prune and export
against ``memory://``, ``file://`` and a real S3 endpoint (moto's server, started here),
as a runner would use them; concurrent writers; and the faults of a remote store."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
from plugin_runs import TWO_MEASURED, WITHOUT_HYPOTHESIS

from pytest_gpuprof import cli
from pytest_gpuprof.baselines import reach
from pytest_gpuprof.baselines import store as store_module
from pytest_gpuprof.baselines.records import BaselineError, shown
from pytest_gpuprof.baselines.store import INDEX, PACK_AT, Store

# imported at collection, before any in-process pytest run: a run that imported botocore
# first drops it when it ends (pytester restores sys.modules), and moto's server then
# meets a second copy of it (HTTP 500 "Cannot normalize request of type LocalProxy")
moto_server = pytest.importorskip("moto.server", reason="the test extra installs moto[server]")
pytest.importorskip("s3fs", reason="the test extra installs s3fs")

SUITE = TWO_MEASURED


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible server on a free port, for the whole session (one per xdist worker)."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _s3_env(monkeypatch, endpoint, key="testing"):
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)


def _bucket(endpoint):
    import boto3

    name = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)  # credentials from the environment
    return name


@pytest.fixture(params=["memory", "file", "s3"])
def url(request, tmp_path, monkeypatch):
    """A fresh, empty store of each kind."""
    if request.param == "memory":
        return f"memory://gpuprof-{uuid.uuid4().hex[:12]}/baselines"
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    endpoint = request.getfixturevalue("s3_endpoint")
    _s3_env(monkeypatch, endpoint)
    return f"s3://{_bucket(endpoint)}/ci/repo"


def _report(created, tests=("t",), machine="host-aaa", samples=(5.0, 5.0, 5.0), **extra):
    return {
        "schema": 1,
        "created": created,
        "machine": {"id": machine, "gpu": "g", "backend": "host"},
        "tests": [
            {"nodeid": t, "metrics": {"wall_ms": samples[0]}, "rounds": {"wall_ms": {"samples": list(samples)}}}
            for t in tests
        ],
        **extra,
    }


def _at(second):
    return f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}+00:00"


# --- through pytest, as a runner uses it


def test_a_save_and_a_compare_through_the_store_gate_a_slower_test(pytester, url, monkeypatch):
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(SUITE)
    saved = pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main")
    saved.assert_outcomes(passed=2)
    saved.stdout.fnmatch_lines([f"gpuprof: baseline saved as {shown(url)}/host-*/main@*.json"])
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    result = pytester.runpytest(f"--gpu-storage={url}", "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+10%")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*GPU regression against baseline {shown(url)}/host-*/main@*.json:*"])
    assert "new (not in the baseline)" not in result.stdout.str()


def test_a_save_to_a_bucket_that_is_not_there_is_refused_before_any_test(pytester, s3_endpoint, monkeypatch):
    """Every test once ran, then the save failed at the end: now one line, exit 4."""
    _s3_env(monkeypatch, s3_endpoint)
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--gpu-storage=s3://no-such-bucket/x", "--gpu-save=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-gpuprof: --gpu-storage: s3://no-such-bucket/x: reach its bucket: *"])
    assert "passed" not in result.stdout.str()
    there = f"s3://{_bucket(s3_endpoint)}/x"  # the same, with the bucket made: the run saves
    pytester.runpytest(f"--gpu-storage={there}", "--gpu-save=main").assert_outcomes(passed=2)


def test_shards_of_one_run_gate_every_test_of_a_sharded_pull_request(pytester, url, monkeypatch):
    """Two shards of main save their parts under one run id; two shards of a pull request
    compare with it: each test finds the part that holds it, none reads as new."""
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(SUITE)
    for shard in ("alpha", "omega"):
        r = pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main", "--gpu-run-id=main-1", "-k", shard)
        r.assert_outcomes(passed=1)
        r.stdout.fnmatch_lines(
            ["gpuprof: baseline saved as *main@*@main-1@*.json (deselected 1 test(s)*a part of run main-1)"]
        )
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    outcomes = {}
    for shard in ("alpha", "omega"):
        r = pytester.runpytest(
            f"--gpu-storage={url}", "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+10%", "-k", shard
        )
        assert "new (not in the baseline)" not in r.stdout.str()
        r.stdout.fnmatch_lines(["*(run main-1, 2 parts)*"])
        outcomes[shard] = r.parseoutcomes()
    assert outcomes == {"alpha": {"passed": 1, "deselected": 1}, "omega": {"failed": 1, "deselected": 1}}


def test_a_narrowed_run_without_a_run_id_is_still_no_baseline(pytester, url):
    pytester.makepyfile(SUITE)
    r = pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main", "-k", "alpha")
    r.stdout.fnmatch_lines(["gpuprof: no baseline saved: deselected 1 test(s)*--gpu-run-id"])
    assert Store(url).machines() == []


def test_collect_only_and_gate_failed_runs_stay_out_of_what_compare_picks(pytester, url, monkeypatch):
    """In every kind of store, the real S3 server's included: a --collect-only run and a run
    whose gate failed save nothing, so the next identical run still fails against the
    first baseline, the only one there (a narrowed run: the test above)."""
    monkeypatch.delenv("GPUPROF_SLOW", raising=False)
    pytester.makepyfile(SUITE)
    pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main").assert_outcomes(passed=2)
    (machine,) = Store(url).machines()
    (first,) = Store(url).summaries(machine)
    collected = pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main", "--collect-only")
    collected.stdout.fnmatch_lines(["gpuprof: no baseline saved: was --collect-only*"])
    monkeypatch.setenv("GPUPROF_SLOW", "1")
    for _ in range(2):
        r = pytester.runpytest(
            f"--gpu-storage={url}", "--gpu-save=main", "--gpu-compare=main", "--gpu-compare-fail=kernel_ms:+10%"
        )
        r.assert_outcomes(passed=1, failed=1)
        r.stdout.fnmatch_lines([f"*GPU regression against baseline {shown(url)}/{first.key}:*"])
        r.stdout.fnmatch_lines(["*no baseline saved: had failed tests*"])
    assert Store(url).summaries(machine) == [first]


# the folder and the S3 server (memory:// is one process's: the controller's save reads
# the same there, and each kind's xdist run costs its workers' start)
@pytest.mark.parametrize("url", ["file", "s3"], indirect=True)
def test_an_xdist_run_saves_one_complete_baseline(pytester, url):
    pytester.makepyfile(SUITE)
    # three workers for two tests: one runs none and must not make the baseline partial
    pytester.runpytest("-n", "3", f"--gpu-storage={url}", "--gpu-save=main", *WITHOUT_HYPOTHESIS).assert_outcomes(
        passed=2
    )
    store = Store(url)
    (machine,) = store.machines()
    (summary,) = store.summaries(machine)
    assert sorted(summary.tests) == [
        "test_an_xdist_run_saves_one_complete_baseline.py::test_alpha",
        "test_an_xdist_run_saves_one_complete_baseline.py::test_omega",
    ]
    assert summary.refused is None


# --- the store itself


def test_a_compare_pools_the_last_k_accepted_baselines(url):
    store = Store(url)
    for i, v in enumerate((4.0, 5.0, 6.0)):
        store.save(_report(_at(i), samples=(v, v, v)), "main")
    store.save(_report(_at(9), partial="was interrupted"), "main")  # not accepted: passed over
    ref = store.reference("host-aaa", "main", pooled=2)
    entry, source = ref.entry("t")
    assert source.pooled == 2 and sorted(entry["rounds"]["wall_ms"]["samples"]) == [5.0] * 3 + [6.0] * 3
    assert "pooled over its 2 newest" in ref.why and "passed over 1 newer" in ref.why
    assert ref.entry("not-stored") is None


def _next_second(url):
    """An object store dates its objects to the second: saves a second apart keep their order."""
    if url.startswith("s3://"):
        time.sleep(1.1)


def test_order_is_the_stores_own_never_the_date_a_record_states(url, capsys):
    """A record dated 2099 (a runner whose clock runs ahead, or a crafted file) once ruled
    the history for good, and ``prune --keep 3`` kept it and deleted real records: the
    store's write order decides, and the record is named in a warning."""
    store = Store(url)
    store.save(_report(_at(30), samples=(1.0, 1.0, 1.0)), "main")
    _next_second(url)
    store.save(_report(_at(10), samples=(2.0, 2.0, 2.0)), "main")  # saved later, dated earlier
    assert store.reference("host-aaa", "main").entry("t")[0]["metrics"]["wall_ms"] == 2.0
    _next_second(url)
    store.save(_report("2099-01-01T00:00:00+00:00", samples=(9.0, 9.0, 9.0)), "main")
    for v in (3.0, 4.0, 5.0):
        _next_second(url)
        store.save(_report(_at(40), samples=(v, v, v)), "main")
    reader = Store(url)
    ref = reader.reference("host-aaa", "main")
    assert ref.entry("t")[0]["metrics"]["wall_ms"] == 5.0
    assert "warning: main@20990101T000000.000000Z@" in ref.why and "after the store wrote it" in ref.why
    assert cli.main(["prune", "--keep", "3", "--storage", url, "--machine", "host-aaa"]) == 0
    captured = capsys.readouterr()
    assert "pruned 3 record(s)" in captured.out and "20990101" in captured.out  # the planted one went
    assert "warning:" in captured.err and "20990101" in captured.err
    kept = Store(url).summaries("host-aaa")
    assert [s.tests["t"]["wall_ms"][0] for s in kept] == [3.0, 4.0, 5.0]


def test_history_prune_and_export_read_the_same_store(url, capsys, tmp_path):
    store = Store(url)
    for i in range(4):
        store.save(_report(_at(i), samples=(float(i + 1),) * 3), "main", run_id=f"r{i}")
    store.save(_report(_at(5), tests=("u",)), "main", run_id="r3")  # a second part of run r3
    assert cli.main(["history", "--storage", url, "--metric", "wall_ms"]) == 0
    out = capsys.readouterr().out
    assert "t  wall_ms  (4 runs" in out and "u  wall_ms  (1 runs" in out
    assert cli.main(["prune", "--storage", url, "--keep", "2"]) == 0
    assert "pruned 2 record(s)" in capsys.readouterr().out
    left = store.summaries("host-aaa")
    assert sorted(s.run_id for s in left) == ["r2", "r3", "r3"]  # the shards of r3 are one run
    newest = store.where(left[-1].key)
    assert cli.main(["export", "--format", "bmf", newest]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "u": {"wall_ms": {"value": 5.0, "lower_value": 5.0, "upper_value": 5.0}}
    }
    out = tmp_path / "gab.json"
    assert cli.main(["export", "--format", "github-action-benchmark", newest, "-o", str(out)]) == 0
    (entry,) = json.loads(out.read_text())
    assert entry["name"] == "u wall_ms" and entry["unit"] == "ms" and entry["value"] == 5.0


def test_compare_on_the_command_line_takes_a_name_of_the_store(url, tmp_path, capsys):
    store = Store(url)
    store.save(_report(_at(1), samples=(5.0,) * 5), "main")
    store.save(_report(_at(2), samples=(5.0,) * 5), "main")  # two runs: the spread between them is known
    new = tmp_path / "new.json"
    new.write_text(json.dumps(_report(_at(2), samples=(9.0,) * 5)))
    assert cli.main(["compare", "main", str(new), "--storage", url, "--fail", "wall_ms:+10%"]) == 1
    assert "regression" in capsys.readouterr().out


def test_many_records_are_packed_and_a_pack_is_only_a_cache():
    url = f"memory://gpuprof-{uuid.uuid4().hex[:12]}"
    store = Store(url)
    for i in range(PACK_AT + 2):
        store.save(_report(_at(i)), "main", run_id=f"r{i}")
    first = store.summaries("host-aaa")
    packs = store.fs.find(f"{store.root}/host-aaa/{INDEX}")
    assert len(first) == PACK_AT + 2 and len(packs) == 1
    assert store.summaries("host-aaa") == first  # read back from the pack
    store.fs.pipe_file(f"{store.root}/host-aaa/{INDEX}/torn.json", b'{"summaries": [')
    assert store.summaries("host-aaa") == first
    store.prune("host-aaa", keep=3)
    assert [s.run_id for s in store.summaries("host-aaa")] == [f"r{i}" for i in range(PACK_AT - 1, PACK_AT + 2)]


def test_legacy_numbered_baselines_stay_readable(tmp_path):
    folder = tmp_path / "store" / "host-aaa"
    folder.mkdir(parents=True)
    (folder / "0001_main.json").write_text(json.dumps(_report(_at(1), samples=(3.0,) * 3)))
    store = Store(tmp_path / "store")
    store.save(_report(_at(2), samples=(4.0,) * 3), "main")
    assert [s.name for s in store.summaries("host-aaa")] == ["main", "main"]
    assert store.reference("host-aaa", "main").entry("t")[0]["metrics"]["wall_ms"] == 4.0


# Eight writers, each a process with its own store and connections, forked from one that
# imported the store's library first: each importing s3fs and botocore itself cost 0.45 s
# of CPU, 3.6 s of the test's 6 s.
SAVERS = """
import os, pathlib, sys, time, traceback
import fsspec
from pytest_gpuprof.baselines.store import Store

url, here = sys.argv[1], pathlib.Path(sys.argv[2])
fsspec.get_filesystem_class(fsspec.utils.get_protocol(url))

def save(writer):
    store = Store(url)
    (here / f"ready-{writer}").touch()
    while not (here / "go").exists():  # all eight start saving at once
        time.sleep(0.005)
    for i in range(SAVES):
        created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9 // 1000:06d}+00:00"
        store.save({"schema": 1, "created": created, "machine": {"id": "host-aaa"},
                    "tests": [{"nodeid": "t", "writer": str(writer), "pad": "x" * 20000}]}, "main")

pids = []
for writer in range(8):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            save(writer)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
print("writers' exit codes", codes)
sys.exit(0 if codes == [0] * 8 else 1)
"""


SAVES = 20  # each of eight processes, released together, as the store issue asks: 160 saves, past PACK_AT


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_eight_processes_saving_one_name_at_once_all_land_whole(kind, tmp_path, monkeypatch, request):
    if kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        _s3_env(monkeypatch, endpoint)
        url = f"s3://{_bucket(endpoint)}/x"
    else:
        url = str(tmp_path / "store")
    script = tmp_path / "savers.py"
    script.write_text(SAVERS.replace("SAVES", str(SAVES)))
    savers = subprocess.Popen([sys.executable, str(script), url, str(tmp_path)])
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 8 and time.monotonic() < deadline:
        assert savers.poll() is None, "the savers ended before all were ready"
        time.sleep(0.01)
    (tmp_path / "go").touch()
    assert savers.wait(timeout=300) == 0
    store = Store(url)
    summaries = store.summaries("host-aaa")
    assert len(summaries) == 8 * SAVES  # every save landed
    assert store.fs.find(f"{store.root}/host-aaa/{INDEX}")  # and they were packed
    records = list(store.read_many([s.key for s in summaries]).values())  # none torn: each parses whole
    assert all(len(r["tests"][0]["pad"]) == 20000 for r in records)
    assert {r["tests"][0]["writer"] for r in records} == {str(w) for w in range(8)}  # each writer's
    # the newest is the one the store wrote last (its own order: eight writers at once can
    # land in another order than their records' ``created`` says)
    newest = store.read(summaries[-1].key)
    assert store.reference("host-aaa", None).newest_record["created"] == newest["created"]


# --- faults


def _fail_at_once(monkeypatch):
    """s3fs retries a refused connection with back-off, and botocore each of those again
    (about 2.5 s a call): here a dead endpoint fails at its first refusal, as a user would
    set it (s3fs's retry count, botocore's attempts through fsspec's configuration)."""
    import fsspec.config
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"retries": {"total_max_attempts": 1}}})


def test_the_users_fsspec_configuration_wins_over_the_stores_defaults(monkeypatch):
    """What a user configured for fsspec's ``s3`` (its config files, ``FSSPEC_S3_*``)
    reaches botocore key by key; the store's own settings fill in the rest."""
    import fsspec.config

    _s3_env(monkeypatch, "http://127.0.0.1:9")
    user = {"retries": {"total_max_attempts": 1}, "read_timeout": 7}
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": user, "anon": False})
    store = Store(f"s3://configured-{uuid.uuid4().hex[:8]}/p")
    assert store.fs.config_kwargs == {**reach.S3_DEFAULTS, **user}
    assert store.fs.config_kwargs["connect_timeout"] == reach.S3_DEFAULTS["connect_timeout"]
    assert store.fs.client_kwargs == {"endpoint_url": "http://127.0.0.1:9"}


def test_an_unreachable_store_is_one_line_before_any_test(pytester, monkeypatch):
    port = _free_port()  # nothing listens on it
    _s3_env(monkeypatch, f"http://127.0.0.1:{port}")
    _fail_at_once(monkeypatch)
    pytester.makepyfile(SUITE)
    url = "s3://gone-bucket/prefix"
    r = pytester.runpytest(f"--gpu-storage={url}", "--gpu-save=main", "--gpu-report=r.json")
    assert r.ret == pytest.ExitCode.USAGE_ERROR  # refused before any test ran, not after all of them
    r.stderr.fnmatch_lines([f"ERROR: pytest-gpuprof: --gpu-storage: {url}: reach its bucket: *Could not connect*"])
    assert "Traceback" not in r.stdout.str() + r.stderr.str()
    gated = pytester.runpytest(f"--gpu-storage={url}", "--gpu-compare=main")
    assert gated.ret == pytest.ExitCode.USAGE_ERROR
    gated.stderr.fnmatch_lines([f"*--gpu-compare: {url}: *"])
    # without a gate asked for, the store is not read at all
    pytester.runpytest(f"--gpu-storage={url}").assert_outcomes(passed=2)


def test_a_missing_bucket_is_named(s3_endpoint, monkeypatch):
    _s3_env(monkeypatch, s3_endpoint)
    with pytest.raises(BaselineError, match=r"s3://no-such-bucket-gpuprof/p: write host-aaa/main@.*not found"):
        Store("s3://no-such-bucket-gpuprof/p").save(_report(_at(1)), "main")


def test_a_store_that_stops_mid_run_fails_the_next_step_with_one_line(monkeypatch):
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _s3_env(monkeypatch, endpoint)
    url = f"s3://{_bucket(endpoint)}/p"
    _fail_at_once(monkeypatch)  # before the store's file system is made, which reads it
    store = Store(url)
    store.save(_report(_at(1)), "main")
    server.stop()
    with pytest.raises(BaselineError, match=rf"^{url}: (list|write|read) .*Could not connect"):
        store.save(_report(_at(2)), "main")
        store.summaries("host-aaa")


@pytest.fixture(scope="module")
def s3_with_auth(tmp_path_factory):
    """A moto server in a process of its own that checks every request's credentials (IAM)."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0", "MOTO_PORT": str(port)}
    log = tmp_path_factory.mktemp("moto") / "log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=out, stderr=out
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_wrong_credentials_are_named_without_printing_them(s3_with_auth, monkeypatch):
    endpoint = s3_with_auth
    _s3_env(monkeypatch, endpoint, key="AKIAWRONGKEY00000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-secret-itself")
    with pytest.raises(BaselineError) as e:
        Store("s3://any-bucket/p").save(_report(_at(1)), "main")
    assert str(e.value).startswith("s3://any-bucket/p: write host-aaa/main@")
    assert "InvalidAccessKeyId" in str(e.value) or "access denied" in str(e.value)
    assert "the-secret-itself" not in str(e.value)


def test_credentials_written_into_a_url_are_never_shown():
    assert shown("s3://KEY:SECRET@bucket/p") == "s3://bucket/p"
    assert shown(".gpuprof") == ".gpuprof"


def test_a_scheme_without_its_library_says_which_extra_installs_it(monkeypatch):
    monkeypatch.setitem(reach._EXTRAS, "memory", ("no_such_module_gpuprof", "s3"))
    with pytest.raises(
        BaselineError, match=r"memory:// needs no_such_module_gpuprof: pip install 'pytest-gpuprof\[s3\]'"
    ):
        Store("memory://x")
    with pytest.raises(BaselineError, match="no storage scheme 'nosuch'"):
        Store("nosuch://x")


# --- a store that is damaged, raced, stalled or left half-written (the gate's workflow)


def _put_raw(store, key, text):
    store.fs.pipe_file(store._path(key), text.encode() if isinstance(text, str) else text)


def test_a_damaged_record_is_named_once_and_skipped_and_prune_removes_it(url, capsys, tmp_path):
    """A truncated record, one nested 20,000 deep under another name and one that is not
    UTF-8 stop no compare, history or prune: each is named and skipped, and prune removes
    them; a record of a newer pytest-gpuprof is left alone."""
    store = Store(url)
    for i, v in enumerate((4.0, 5.0)):
        store.save(_report(_at(i), samples=(v, v, v)), "main")
    good = json.dumps(_report(_at(8)))
    damaged = {
        "host-aaa/main@20260101T000009.000000Z@r1@0a.json": good[: len(good) // 2],
        "host-aaa/nightly@20260101T000010.000000Z@r2@0b.json": "[" * 20_000 + "]" * 20_000,
        "host-aaa/main@20260101T000011.000000Z@r3@0c.json": b"\xff\xfe not text",
    }
    for key, text in damaged.items():
        _put_raw(store, key, text)
    newer = "host-aaa/main@20260101T000012.000000Z@r4@0d.json"
    _put_raw(store, newer, json.dumps({**_report(_at(12)), "schema": 99}))

    ref = Store(url).reference("host-aaa", "main")
    assert ref.entry("t")[0]["metrics"]["wall_ms"] == 5.0  # the newest readable one
    # the two newer records of its name that cannot be read are named, not passed over in silence
    assert "warning: passed over 2 newer record(s) that cannot be read: main@20260101T000009" in ref.why
    assert "main@20260101T000011.000000Z@r3@0c.json is damaged (" in ref.why and "nightly@" not in ref.why
    reader = Store(url)
    reader.summaries("host-aaa")
    assert set(reader.damaged) == set(damaged)
    assert any("nested too deep" in why for why in reader.damaged.values())
    assert any("not UTF-8" in why for why in reader.damaged.values())

    assert cli.main(["history", "--storage", url, "--machine", "host-aaa"]) == 0
    out, err = capsys.readouterr()
    assert "t  wall_ms  (2 runs" in out
    assert sum("skipped" in line for line in err.splitlines()) == 3  # each named once
    new = tmp_path / "new.json"
    new.write_text(json.dumps(_report(_at(20))))
    assert cli.main(["compare", "main", str(new), "--storage", url]) == 0
    assert "t: undecided" in capsys.readouterr().out

    assert cli.main(["prune", "--keep", "5", "--storage", url, "--machine", "host-aaa"]) == 0
    out = capsys.readouterr().out
    assert out.count("(damaged: ") == 3
    left = Store(url)._listing("host-aaa")
    assert not set(damaged) & set(left) and newer in left  # the newer schema's record untouched
    assert len([k for k in left if "/_index/" not in k]) == 3


def test_a_pack_replaced_between_listing_and_reading_loses_no_record(url, monkeypatch):
    """Another reader packs and deletes the old packs while this one is about to read
    them: the missing pack is only a cache, its records are read loose."""
    store = Store(url)
    for i in range(3):
        store.save(_report(_at(i)), "main")
    listing = store._listing
    gone = "host-aaa/_index/20260101T000000.000000Z@deadbeef.json"
    monkeypatch.setattr(store, "_listing", lambda machine: [*listing(machine), gone])
    assert len(store.summaries("host-aaa")) == 3
    assert store.reference("host-aaa", "main").entry("t") is not None


def test_a_record_pruned_between_listing_and_reading_is_left_out(url, monkeypatch):
    store = Store(url)
    for i in range(3):
        store.save(_report(_at(i)), "main")
    listing = store._listing
    gone = "host-aaa/main@20260101T000005.000000Z@rr@ab.json"
    monkeypatch.setattr(store, "_listing", lambda machine: [*listing(machine), gone])
    assert [s.key for s in store.summaries("host-aaa")] == [k for k in listing("host-aaa")]


def test_the_next_save_or_prune_clears_what_a_killed_save_left(tmp_path):
    """A save killed between writing its partial file and renaming it leaves the file; the
    next save (or prune) removes the stale ones, and never a save still in flight."""
    store = Store(tmp_path)
    store.save(_report(_at(1)), "main")
    folder = tmp_path / "host-aaa"
    stale = [folder / ".gpuprof.killed1.tmp", folder / "_index" / ".gpuprof.killed2.tmp"]
    fresh = folder / ".gpuprof.inflight.tmp"
    for path in (*stale, fresh):
        path.parent.mkdir(exist_ok=True)
        path.write_text("{")
    old = time.time() - store_module.STALE_TMP_S - 60
    for path in stale:
        os.utime(path, (old, old))
    store.save(_report(_at(2)), "main")
    assert not any(p.exists() for p in stale) and fresh.exists()
    os.utime(fresh, (old, old))
    store.prune("host-aaa", keep=5)
    assert not fresh.exists()


@pytest.fixture
def stalled_endpoint(monkeypatch):
    """An S3 endpoint that accepts every connection and never answers, and a user's fsspec
    configuration of one attempt with one-second timeouts."""
    import fsspec.config

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)  # the loop looks at ``stop`` ten times a second
    held = []
    stop = False

    def accept():
        while not stop:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)  # kept open, never read, never answered

    import threading

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    _s3_env(monkeypatch, endpoint)
    config = {"connect_timeout": 1, "read_timeout": 1, "retries": {"total_max_attempts": 1}}
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": config})
    yield endpoint
    stop = True
    thread.join(10)  # its last accept lands in ``held`` before they are closed
    listener.close()
    for conn in held:
        conn.close()


def test_a_stalled_endpoint_ends_each_call_within_the_timeouts_and_is_never_an_empty_store(stalled_endpoint, capsys):
    url = f"s3://stalled-{uuid.uuid4().hex[:8]}/p"
    store = Store(url)
    assert store.deadline == 1 * (1 + 1) + reach.DEADLINE_MARGIN_S
    for call in (
        lambda: store.save(_report(_at(1)), "main"),
        lambda: store.reference("host-aaa", "main"),
        lambda: store.summaries("host-aaa"),
        lambda: store.machines(),
    ):
        with pytest.raises(reach.StoreError) as raised:
            call()
        assert str(raised.value).startswith(f"{url}: ")
        assert "timeout" in str(raised.value).lower() or "did not answer" in str(raised.value)
    assert cli.main(["history", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert url in err and "holds no baselines" not in err


def test_a_call_that_outlives_the_deadline_is_named_with_the_timeouts(monkeypatch):
    """The deadline holds whatever the library does: a call that never returns ends at it."""
    import threading

    store = Store("memory://gpuprof-deadline/p")
    store.deadline = 0.2
    never = threading.Event()
    monkeypatch.setattr(store.fs, "ls", lambda *a, **k: never.wait())
    with pytest.raises(reach.StoreError, match=r"memory://gpuprof-deadline/p: list: the store did not answer"):
        store.machines()
    never.set()


def test_any_machine_takes_a_name_after_a_driver_update(url):
    """A driver update gives the runner a new machine id: --gpu-compare=main with
    --gpu-compare-any-machine compares with the newest main of any machine, and says what
    differs; without it, the error names the machines that have one."""
    from pytest_gpuprof.baselines.gate import Gate
    from pytest_gpuprof.baselines.records import BaselineError

    store = Store(url)
    old = _report(_at(1), machine="host-old")
    old["machine"]["driver"] = "550.1"
    store.save(old, "main")
    store.save(_report(_at(5), machine="host-other"), "nightly")
    ours = {"id": "host-new", "gpu": "g", "backend": "host", "driver": "580.2"}
    with pytest.raises(BaselineError, match=r"no baseline named 'main' for machine host-new.*host-old.*any-machine"):
        Gate.open("main", ours, (), url)
    gate = Gate.open("main", ours, (), url, any_machine=True)
    assert gate is not None and "host-old/main@" in gate.where
    assert gate.note == "baseline of another machine (driver 550.1 -> 580.2)"
    comparison = gate.compare("t", _report(_at(9))["tests"][0])
    assert comparison.status == "compared" and "another machine" in comparison.lines()[1]


def test_an_unreachable_http_store_is_its_error_never_no_baseline():
    from pytest_gpuprof.baselines.gate import Gate

    port = _free_port()  # nothing listens on it
    url = f"http://127.0.0.1:{port}/store"
    with pytest.raises(reach.StoreError, match=rf"^{url}: list: .*Connect"):
        Gate.open("main", {"id": "host-aaa"}, (), url)
