"""What the baseline store costs against a real S3 endpoint (moto's server, started here).

``python3 benchmarks/store.py [--sizes 1,100,10000] [--others 10000] [--server thread|process]``:
for each size N,
a fresh bucket holding N baselines of one machine (saved through ``Store.save``, 8 at a
time as runners would) beside ``--others`` records of other machines; then, timed:

- one save, and one compare's reference of a test (``Store.reference`` + ``entry``);
- ``gpuprof history`` of the machine, first as the store is after the saves (every record
  loose: read once, then packed) and then as a fleet's store stays (packed, a few loose).

A record is a report of 5 tests with 5 rounds of 20 metrics each. Every figure is one
wall-clock time in seconds on this machine; moto answers a request in about 5-10 ms
here, so the cost is mostly the number of requests. ``--server thread`` runs moto in this
process, as the suite's tests do, where its work takes the reader's interpreter lock;
``process`` (the default) runs it in a process of its own, as an endpoint is another
machine's.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import io
import logging
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METRICS = ("wall_ms", "kernel_ms", "utilization", *(f"steps.s{i}.idle_ms" for i in range(17)))


def _record(machine: str, i: int) -> dict:
    """The i-th run: every figure 100 ms give or take 1%, a level that steps up 5% every 1,000 runs."""
    noise = random.Random(i)
    level = 100.0 * 1.05 ** (i // 1000)
    tests = []
    for t in range(5):
        rounds = {m: {"samples": [level * (1 + noise.uniform(-0.01, 0.01)) for _ in range(5)]} for m in METRICS}
        tests.append({"nodeid": f"tests/test_perf.py::test_{t}", "metrics": {"wall_ms": float(i)}, "rounds": rounds})
    created = f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00"
    return {"schema": 1, "created": created, "machine": {"id": machine, "backend": "host"}, "tests": tests}


def _server(how: str) -> str:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    if how == "thread":
        from moto.server import ThreadedMotoServer

        ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    else:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(server.terminate)
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    return endpoint


def _timed(what: str, call, results: list[tuple[str, float]]):
    start = time.perf_counter()
    out = call()
    results.append((what, time.perf_counter() - start))
    print(f"  {what}: {results[-1][1]:.2f} s", flush=True)
    return out


def bench(size: int, others: int) -> list[tuple[str, float]]:
    import boto3

    from pytest_gpuprof import cli
    from pytest_gpuprof.baselines.store import Store

    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/repo"
    store = Store(url)
    results: list[tuple[str, float]] = []
    print(f"{size} baselines of one machine, {others} of other machines beside them", flush=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(store.save, _record(f"host-other{i % 50:02d}", i), "main") for i in range(others)]
        jobs += [pool.submit(store.save, _record("host-bench", i), "main") for i in range(size)]
        _timed(f"setup: {size + others} saves, 8 at a time", lambda: [j.result() for j in jobs], results)
    quiet = io.StringIO()
    with redirect_stdout(quiet):
        _timed(
            "history, every record loose (read, then packed)",
            lambda: cli.main(["history", "--storage", url, "--machine", "host-bench"]),
            results,
        )
        for i in range(5):  # what a fleet's store holds between packs: a few new records
            Store(url).save(_record("host-bench", size + i), "main")
        _timed(
            "history, packed with 5 loose",
            lambda: cli.main(["history", "--storage", url, "--machine", "host-bench"]),
            results,
        )
    _timed("one save", lambda: Store(url).save(_record("host-bench", size + 9), "main"), results)
    _timed(
        "one compare's baseline of a test",
        lambda: Store(url).reference("host-bench", "main").entry("tests/test_perf.py::test_0"),
        results,
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,100,10000", help="baselines of the measured machine, comma-separated")
    parser.add_argument("--others", type=int, default=10000, help="records of other machines beside them")
    parser.add_argument("--server", choices=("thread", "process"), default="process", help="where moto runs")
    args = parser.parse_args(argv)
    _server(args.server)
    table = []
    for size in (int(s) for s in args.sizes.split(",")):
        table.append((size, bench(size, args.others)))
    print("\nbaselines  " + "  ".join(f"{what}" for what, _ in table[0][1]))
    for size, results in table:
        print(f"{size:>9}  " + "  ".join(f"{t:.2f}" for _, t in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
