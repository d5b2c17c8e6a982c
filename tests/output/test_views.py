"""Perfetto traces and the HTML report: structure, escaping, size, and a real browser."""

import html
import json
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plugin_runs import DATA_BLOCK, page_data_of

from pytest_gpuprof.analysis import metrics
from pytest_gpuprof.analysis.model import DeviceInterval, Sample, Span
from pytest_gpuprof.analysis.timeline import Timeline
from pytest_gpuprof.output.html import page_data, render
from pytest_gpuprof.output.trace import file_name, trace_events
from pytest_gpuprof.verdict.budget import Budget, evaluate
from pytest_gpuprof.verdict.record import GpuRecord

MS = 1_000_000
EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'

SUITE = """
import pytest
from hypothesis import given
from hypothesis import strategies as st

@pytest.mark.parametrize("name", ['<script>alert("x")</script><img src=x onerror=alert(1)>', "plain"])
def test_pipeline(gpuprof, gpu_workload, name):
    with gpuprof.region("partition"):
        with gpuprof.step(name):
            gpu_workload.upload(1 << 20)
        gpu_workload.compute(ms=2)

@pytest.mark.gpu_budget(min_utilization=0.99)
def test_breaching(gpu_workload):
    gpu_workload.partitions(n=2, upload_bytes=1 << 20, compute_ms=1, rounds=1, warmup=0)
"""


def sample_timeline(kernels=3):
    steps = (Span("upload", 1, 0, 10 * MS, span_id=1, bytes=1 << 20, stream=2), Span("compute", 2, 10 * MS, 40 * MS))
    kernel_intervals = [
        DeviceInterval("kernel", 10 * MS + i * 500, 10 * MS + i * 500 + 250, stream=3, name=f"k{i}")
        for i in range(kernels)
    ]
    device = (*kernel_intervals, DeviceInterval("memcpy", 1 * MS, 9 * MS, stream=2, bytes=1 << 20))
    samples = (Sample(5 * MS, util=0.9, power_w=300.0),)
    return Timeline(0, 40 * MS, "cupti", steps, (Span(EVIL, 1, 0, 40 * MS),), device, samples)


def test_trace_has_a_process_tracks_and_counters():
    data = trace_events("t.py::test_x", sample_timeline())
    events = data["traceEvents"]
    assert {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "t.py::test_x"}} in events
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert set(tracks.values()) == {
        "host thread 1: steps",
        "host thread 2: steps",
        "regions (brackets)",
        "kernels, stream 3",
        "memcpys, stream 2",
        "kernel-idle, charged to",
    }
    spans = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in spans)
    (copy,) = [e for e in spans if e["cat"] == "memcpy"]
    assert copy["args"] == {"bytes": 1 << 20, "GB/s": round((1 << 20) / (8 * MS), 2), "pageable": False}
    idle = [e for e in spans if e["cat"] == "idle"]
    assert idle[0]["name"] == "upload" and idle[0]["args"]["charged_ms"] == {"upload": 10.0}
    assert [e["args"]["value"] for e in events if e["ph"] == "C"] == [90.0, 300.0]
    json.dumps(data)  # plain JSON throughout


def test_trace_file_names_are_safe_and_distinct():
    a, b = file_name("t.py::test[a/b]"), file_name("t.py::test[a_b]")
    assert a != b and "/" not in a and a.endswith(".json")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", file_name(EVIL))


def record_for(timeline, nodeid="t.py::test"):
    m = metrics.compute(timeline)
    budget = Budget(min_utilization=0.99)
    return GpuRecord(nodeid, m, budget, evaluate(budget, m), enforced=True)


def test_html_escapes_untrusted_names_and_fetches_nothing():
    page = render(
        [page_data(record_for(sample_timeline(), nodeid=f"t.py::test[{EVIL}]"), sample_timeline())], {"id": "m"}
    )
    assert EVIL not in page
    assert "<script>alert" not in page and "<img" not in page
    assert page.count("<script") == 2  # the data block and the page's own script
    # the only URL in the page is the SVG namespace name, which is an identifier, not a fetch
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}
    markup = DATA_BLOCK.sub("", page)
    assert not re.search(r"\b(src|href)\s*=", markup)  # no element loads anything
    data = page_data_of(page)
    assert data["tests"][0]["id"] == f"t.py::test[{EVIL}]"


def test_html_stays_small_with_50000_kernels():
    timeline = sample_timeline(kernels=50_000)
    page = render([page_data(record_for(timeline), timeline)], {"id": "m"})
    assert len(page) < 600_000, len(page)
    data = json.loads(re.search(r'id="data">(.*?)</script>', page, re.S)[1])
    (kernels,) = [lane for lane in data["tests"][0]["lanes"] if lane["kind"] == "kernel"]
    assert len(kernels["items"]) <= 1500
    assert sum(item[3] for item in kernels["items"]) == 50_000  # every kernel is counted in a merged item


def test_plugin_writes_traces_and_html(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--gpu-backend=host", "--gpu-trace=traces", "--gpu-html=report.html")
    result.assert_outcomes(passed=3, warnings=1)
    traces = sorted(Path(pytester.path, "traces").glob("*.json"))
    assert len(traces) == 3
    for path in traces:
        assert json.loads(path.read_text())["traceEvents"]
    page = Path(pytester.path, "report.html").read_text()
    assert EVIL not in page
    result.stdout.fnmatch_lines(
        ["gpuprof: HTML report written to report.html", "gpuprof: one trace per test in traces*"]
    )


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",
    "--window-size=1300,1300",
]


def chromium(*args):
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [shutil.which("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )


# one browser for several views: each page in a frame of a page beside the first, whose
# script copies each frame's document into its own once all have loaded and acted (a
# browser takes a second or two to start; a test reads several views of one page)
FRAMES = """<!doctype html><html><body>{}<script>
window.addEventListener("load", () => {{
  for (const frame of document.querySelectorAll("iframe")) {{
    const out = document.createElement("pre");
    out.className = "frame";
    out.textContent = frame.contentDocument.documentElement.outerHTML;
    document.body.appendChild(out);
  }}
}});
</script></body></html>"""


def chromium_doms(*urls, also=()):
    """Each page's DOM after its script ran (``--dump-dom`` of each, from one browser);
    ``also``: more of the browser's flags (a screenshot, in which the first page fills the
    window)."""
    first = Path(urllib.parse.unquote(urllib.parse.urlparse(urls[0]).path))
    frames = "".join(f'<iframe src="{html.escape(u)}" width="1300" height="1300"></iframe>' for u in urls)
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=first.parent, delete=False) as page:
        page.write(FRAMES.format(frames))
    try:
        dom = chromium("--allow-file-access-from-files", "--dump-dom", *also, Path(page.name).as_uri()).stdout
    finally:
        Path(page.name).unlink()
    doms = [html.unescape(d) for d in re.findall(r'<pre class="frame">(.*?)</pre>', dom, re.S)]
    assert len(doms) == len(urls), dom[:2000]
    return doms


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (installed by .ci/run)")
def test_html_renders_and_a_click_shows_the_timeline_in_chromium(pytester, tmp_path):
    pytester.makepyfile(SUITE)
    pytester.runpytest("--gpu-backend=host", "--gpu-html=report.html").assert_outcomes(passed=3, warnings=1)
    url = Path(pytester.path, "report.html").as_uri()
    shot = tmp_path / "report.png"
    after, before = chromium_doms(url + "#click=2", url, also=[f"--screenshot={shot}"])
    assert before.count("<tr data-index=") == 3
    assert 'class="breach"' in before  # the breaching test is highlighted
    assert "Click a test to see its timeline." in before
    # '#click=N' makes the page click row N itself, through the same handler as a mouse
    assert "test_breaching" in re.search(r'<div id="detail"><h2>(.*?)</h2>', after)[1]
    lanes = re.findall(r'<g class="lane" data-kind="(\w+)">', after)
    assert {"step", "region", "kernel", "memcpy", "idle"} <= set(lanes)
    assert after.count('class="item"') > 5
    assert "breach of min_utilization" in after
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_idle_stretches_keep_their_step_when_merged():
    from pytest_gpuprof.analysis.lanes import Item, bucket

    items = [Item(i * 10, i * 10 + 5, "upload" if i < 500 else "compute") for i in range(1000)]
    merged = bucket(items, 10_000, 100, by_label=True)
    assert {m.label for m in merged} == {"upload", "compute"}
    assert sum(m.count for m in merged) == 1000
    assert len(merged) <= 101


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50), st.sampled_from("abc"), st.integers(1, 3))),
    st.integers(1, 1200),
    st.integers(1, 20),
    st.booleans(),
)
def test_bucket_merges_exactly_the_runs_of_neighbours_in_one_bucket(raw, span, buckets, by_label):
    """Against a brute force: each run of neighbours whose starts fall in one 1/buckets of
    the span (and, by_label, of one label) is one item holding their count and extent."""
    from pytest_gpuprof.analysis.lanes import Item, bucket

    items = [Item(start, start + length, label, {"arg": 1}, count) for start, length, label, count in raw]
    got = bucket(items, span, buckets, "kernels", by_label=by_label)
    if len(items) <= buckets:
        assert got == items
        return
    keys = [(min(buckets - 1, int(i.start // (span / buckets))), i.label if by_label else "") for i in items]
    runs: list[list[Item]] = []
    for k, item in enumerate(items):
        if k and keys[k] == keys[k - 1]:
            runs[-1].append(item)
        else:
            runs.append([item])
    expected = [
        run[0]
        if len(run) == 1
        else Item(
            run[0].start,
            max(i.end for i in run),
            run[0].label if by_label else f"{sum(i.count for i in run)} kernels",
            {},
            sum(i.count for i in run),
        )
        for run in runs
    ]
    assert got == expected


def test_kernels_carry_their_sm_coverage_for_shading():
    from pytest_gpuprof.analysis.lanes import build
    from pytest_gpuprof.analysis.model import DeviceInterval
    from pytest_gpuprof.analysis.occupancy import SmLimits
    from pytest_gpuprof.analysis.timeline import Timeline

    device = (
        DeviceInterval("kernel", 0, 10, name="spin", blocks=1, threads=32),
        DeviceInterval("kernel", 10, 20, name="gemm", blocks=512, threads=256, registers=128),
        DeviceInterval("kernel", 20, 30, name="unknown"),  # no geometry: drawn solid
    )
    lanes, _ = build(Timeline(0, 30, "cupti", device=device, sm=SmLimits(sms=132)))
    (kernels,) = [lane for lane in lanes if lane.kind == "kernel"]
    shades = {item.label: item.args.get("SMs") for item in kernels.items}
    assert shades == {"spin": round(1 / 132, 4), "gemm": pytest.approx(1.0, abs=0.05), "unknown": None}
    lanes, _ = build(Timeline(0, 30, "host", device=device))  # no SMs known: no shading
    assert all("SMs" not in item.args for lane in lanes for item in lane.items)


SEED_PAGE = """
def test_seed(gpu_workload):
    gpu_workload.partitions(n=4, upload_bytes=64 << 20, compute_ms=5, rounds=1, warmup=0)

def test_no_idle(gpu_workload):
    gpu_workload.compute(ms=3)
"""


def _seed_page(pytester):
    pytester.makepyfile(SEED_PAGE)
    pytester.runpytest("--gpu-backend=host", "--gpu-html=report.html").assert_outcomes(passed=2)
    return Path(pytester.path, "report.html").as_uri()


def _view(dom):
    """The timeline's visible range, as the page wrote it back (us)."""
    tag = re.search(r'<div id="view"[^>]*>', dom)[0]
    return float(re.search(r'data-lo="([^"]+)"', tag)[1]), float(re.search(r'data-hi="([^"]+)"', tag)[1])


def _row(url, nodeid_part):
    """The row of a test: its index among the page's tests (its row's ``data-index``)."""
    data = page_data_of(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).read_text())
    return next(i for i, t in enumerate(data["tests"]) if nodeid_part in t["id"])


needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Debian's chromium (installed by .ci/run)"
)


@needs_chromium
def test_the_timeline_zooms_about_the_pointer_pans_by_the_drag_and_stays_in_the_window(pytester):
    url = _seed_page(pytester)
    seed = _row(url, "test_seed")
    views = [
        _view(dom)
        for dom in chromium_doms(
            *(
                f"{url}#click={seed}{then}"
                for then in ("", "&wheel=0,5", "&wheel=0.5,5", "&wheel=0.5,5&drag=-0.1", "&wheel=0.5,-6", "&drag=0.3")
            )
        )
    ]
    whole = views[0]
    assert whole[0] == 0 and whole[1] > 0
    span = whole[1]
    lo, hi = views[1]  # the wheel at the plot's left edge
    assert lo == 0 and hi == pytest.approx(span * 0.8**5)  # t = 0 stays in view
    lo, hi = views[2]  # at its middle
    # centred within a pixel (events carry whole-pixel positions; the plot is 960 px wide)
    assert (lo + hi) / 2 == pytest.approx(span / 2, abs=(hi - lo) / 960) and hi - lo == pytest.approx(span * 0.8**5)
    zoomed = hi - lo
    lo2, hi2 = views[3]  # then a drag
    assert abs((lo2 - lo) - 0.1 * zoomed) <= 0.01 * zoomed and hi2 - lo2 == pytest.approx(zoomed)
    assert views[4] == (0, span)  # zoom-out stops
    assert views[5] == (0, span)  # no pan past the window


@needs_chromium
def test_the_timeline_names_its_steps_and_shows_only_what_is_there(pytester):
    url = _seed_page(pytester)
    seed, quiet = chromium_doms(f"{url}#click={_row(url, 'test_seed')}", f"{url}#click={_row(url, 'test_no_idle')}")
    labels = re.findall(r'<text [^>]*class="label"[^>]*>([^<]+)</text>', seed)
    assert {"upload", "compute"} <= set(labels)  # step names on their boxes at the default zoom
    assert re.findall(r'class="tick">([^<]+) ms<', seed)  # a time axis with ticks
    assert "kernel-idle, charged to" in seed
    lanes = set(re.findall(r'<g class="lane" data-kind="(\w+)">', quiet))
    assert "idle" not in lanes and "region" not in lanes  # no lane for what is not there
    legend = re.search(r'<div class="legend">.*?</div>', quiet)[0]
    assert "kernels" in legend and "memsets" not in legend and "brackets" not in legend  # nor in the legend
    assert "<h2>budget</h2>" not in quiet  # no budget, no section


@needs_chromium
def test_a_page_of_two_thousand_tests_loads_sorts_and_filters(tmp_path):
    from pytest_gpuprof.output.html import render

    tests = []
    for i in range(2000):
        failed = i % 250 == 7
        tests.append(
            {
                "id": f"t.py::test_{i:04d}" + ("[" + "x" * 300 + "]" if i == 3 else ""),
                "outcome": "failed" if failed else "passed",
                "xfail": False,
                "verdict": "FAIL: breach min_utilization" if failed else "ok",
                "breaches": [],
                "limits": {},
                "explain": [],
                "metrics": {"wall_ms": float((i * 7919) % 2000), "utilization": 0.5, "reported_utilization": None},
                "steps": {},
                "lanes": [],
                "counters": [],
                "span_us": 0,
            }
        )
    page = tmp_path / "big.html"
    page.write_text(render(tests, {"id": "m"}))
    dom, failed = chromium_doms(page.as_uri() + "#sort=wall_ms", page.as_uri() + "#failed=1")
    walls = [
        float(w) for w in re.findall(r'<tr data-index="\d+"[^>]*><td[^>]*>[^<]*</td><td class="num">([^<]+)<', dom)
    ]
    assert len(walls) == 2000 and walls == sorted(walls)
    loaded, sorted_ms = (
        float(x) for x in re.search(r'data-loaded_ms="([^"]+)" data-sorted_ms="([^"]+)"', dom).groups()
    )
    print(f"\n2,000 tests: loaded in {loaded:.0f} ms, sorted in {sorted_ms:.0f} ms (headless Chromium)")
    assert failed.count("<tr data-index=") == 8 and "8 of 2000 tests shown" in failed


@needs_chromium
def test_the_history_page_draws_the_band_the_medians_and_the_change_point(tmp_path):
    from pytest_gpuprof.analysis.changepoints import change_points
    from pytest_gpuprof.baselines.history import Run, Series, page

    medians = [20.0, 20.1, 19.9, 22.0, 22.1, 21.9]
    runs = tuple(
        Run(f"{i + 1:04d}_main", "2026-12-01", f"c{i}abcdef", (m - 0.1, m, m + 0.2)) for i, m in enumerate(medians)
    )
    series = Series("t.py::test_loop", "kernel_ms", runs, tuple(change_points(medians)))
    path = tmp_path / "history.html"
    path.write_text(page([series], "cuda-x"))
    dom = chromium("--dump-dom", path.as_uri()).stdout
    assert dom.count('class="band"') == 1 and dom.count("<circle") == 6
    assert 'class="change"' in dom and "change +10.0% at c3abcdef" in dom


def test_the_summary_shows_failures_first_and_counts_the_rest(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("i", range(300))
        @pytest.mark.gpu_budget(max_overhead_ms=1000)
        def test_trivial(i):
            pass

        @pytest.mark.gpu_budget(min_utilization=0.5)
        def test_zz_idle(gpuprof):
            with gpuprof.step("prepare"):
                gpuprof.backend.clock.spend(5_000_000)
        """
    )
    result = pytester.runpytest("--gpu-budget", "--gpu-report=r.json")
    result.assert_outcomes(passed=300, failed=1)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "gpuprof: true GPU utilization" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("=") and i > start and "short test summary" in line)
    summary = lines[start:end]
    assert len(summary) <= 40, "\n".join(summary)
    assert "test_zz_idle" in summary[summary.index(next(x for x in summary if x.startswith("test "))) + 1]
    assert "and 281 more measured, none failed or breached; --gpu-summary=all lists them" in summary
    assert len(json.loads(pytester.path.joinpath("r.json").read_text())["tests"]) == 301
    every = pytester.runpytest("--gpu-summary=all")
    assert sum(line.startswith("test_the_summary") and "::test_trivial[" in line for line in every.stdout.lines) == 300


def test_a_step_name_with_a_lone_surrogate_is_written_escaped_in_every_file(pytester):
    """A name read from the user's code may hold a lone surrogate: the CSV, the JSON and the
    page are written (the name escaped), the summary shown, the baseline saved."""
    pytester.makepyfile(
        test_odd="""
def test_odd(gpuprof, gpu_workload):
    with gpuprof.step("up\\udc80load"):
        gpu_workload.compute(ms=1)
"""
    )
    result = pytester.runpytest("--gpu-csv=t.csv", "--gpu-report=r.json", "--gpu-html=p.html", "--gpu-save=main")
    result.assert_outcomes(passed=1)
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["gpuprof: baseline saved as *"])
    for name in ("t.csv", "r.json", "p.html"):
        assert "udc80load" in (pytester.path / name).read_text(), name


def test_traces_that_cannot_be_written_fail_the_run_once_and_no_test(pytester, monkeypatch):
    """``--gpu-trace`` on a full disk once turned 6 passing tests into "5 failed, 1 passed,
    5 errors" and 18,512 lines: the tests keep their outcomes, the run fails once, in one line."""
    import errno

    from pytest_gpuprof.output import trace

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace, "write_atomic", full)
    pytester.makepyfile(
        test_many="import pytest\n\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_one(gpu_workload, i):\n    gpu_workload.compute(ms=1)\n"
    )
    (pytester.path / "traces").mkdir()
    result = pytester.runpytest("--gpu-trace=traces")
    result.assert_outcomes(passed=6)
    assert result.ret == 1
    lines = [line for line in result.stdout.lines if "could not write the traces" in line]
    assert lines == ["gpuprof: could not write the traces to traces: No space left on device"]


def test_under_xdist_a_trace_that_cannot_be_written_fails_the_run_once(pytester):
    from pytest_gpuprof.output.trace import file_name

    pytester.makepyfile(
        test_many="import pytest\n\n@pytest.mark.parametrize('i', range(4))\n"
        "def test_one(gpu_workload, i):\n    gpu_workload.compute(ms=1)\n"
    )
    traces = pytester.path / "traces"
    for i in range(4):  # a folder where each trace's file would go: no file can be written there
        (traces / file_name(f"test_many.py::test_one[{i}]")).mkdir(parents=True)
    result = pytester.runpytest("-n", "2", "--gpu-trace=traces")
    result.assert_outcomes(passed=4)
    assert result.ret == 1
    assert len([line for line in result.stdout.lines if "could not write the traces" in line]) == 1


def test_the_page_is_written_from_each_processs_spool_and_the_spools_go(pytester, monkeypatch, tmp_path):
    """800 tests of 1,000 steps once held 285 MB with --gpu-html against 74 MB without (each
    test's page data kept in memory to the end): each test's part is now spooled to a file of
    its process (an xdist worker's own) and the page written as it is read. Every test is on
    the page, under xdist too, and no spool is left."""
    import json
    import re

    spools = tmp_path / "spools"
    spools.mkdir()
    monkeypatch.setenv("TMPDIR", str(spools))
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.parametrize('i', range(4))\n"
        "def test_steps(gpuprof, gpu_workload, i):\n"
        "    with gpuprof.window('w'):\n"
        "        for _ in range(50):\n"
        "            with gpuprof.step('s'):\n"
        "                gpu_workload.compute(ms=0.1)\n"
    )
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-html=r.html", "--gpu-host-clock=virtual")
    result.assert_outcomes(passed=4)
    text = (pytester.path / "r.html").read_text()
    data = json.loads(re.search(r'id="data">(.*?)</script>', text, re.S).group(1))
    assert sorted(t["id"].rsplit("::", 1)[1] for t in data["tests"]) == [f"test_steps[{i}]" for i in range(4)]
    assert all(t["steps"] for t in data["tests"]) and not list(spools.glob("gpuprof-page-*"))
