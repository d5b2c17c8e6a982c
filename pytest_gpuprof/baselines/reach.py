"""What it takes to reach a baseline store: a URL's scheme and the library that opens it,
the storage options fsspec gets (botocore's timeouts as defaults), the deadline of one
call, and the words for what did not answer."""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pytest_gpuprof.baselines.records import BaselineError, shown

T = TypeVar("T")

# the scheme's fsspec library and the extra that installs it
_EXTRAS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "az": ("adlfs", "azure")}
_EXTRAS |= {"abfs": _EXTRAS["az"], "abfss": _EXTRAS["az"]}
# an unreachable endpoint fails in seconds, not botocore's minute a try
S3_DEFAULTS = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 2}}
# beyond botocore's attempts, a call's own margin (its event loop, DNS, the TLS handshake)
DEADLINE_MARGIN_S = 2.0


def deadline_s(options: dict[str, Any]) -> float | None:
    """How long one call to a store may take, from its timeouts: every attempt's connect
    and read timeouts, and a margin. ``None``: a store that never waits on a network."""
    config = options.get("config_kwargs")
    if config is None:
        return None
    retries = config.get("retries") or {}
    attempts = retries.get("total_max_attempts") or retries.get("max_attempts") or 1
    return int(attempts) * (float(config.get("connect_timeout", 60)) + float(config.get("read_timeout", 60))) + (
        DEADLINE_MARGIN_S
    )


def fs_options(scheme: str) -> dict[str, Any]:
    """The storage options of a scheme. fsspec keeps one client per set of options: the
    endpoint in the environment (``AWS_ENDPOINT_URL``) is one of them, so a changed
    endpoint gets a client of its own.

    The store's botocore settings are defaults: what the user configured for fsspec's
    ``s3`` (its config files, ``FSSPEC_S3_*``) wins, key by key. Options passed here
    replace fsspec's configured ones whole, so they are merged first."""
    if scheme != "s3":
        return {}
    import fsspec.config

    configured = fsspec.config.conf.get("s3", {})
    options: dict[str, Any] = {"config_kwargs": {**S3_DEFAULTS, **configured.get("config_kwargs", {})}}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint, **configured.get("client_kwargs", {})}
    return options


class StoreError(BaselineError):
    """A store that cannot be reached, read or written: the URL (credentials left out) and what failed."""


def within(deadline: float | None, call: Callable[[], T]) -> T:
    """``call()``, or a ``TimeoutError`` once ``deadline`` seconds passed: a storage library
    that stalls (an endpoint that accepts and never answers) is left to finish in a daemon
    thread, which holds no lock of ours."""
    if deadline is None:
        return call()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name="gpuprof-store", daemon=True)
    worker.start()
    worker.join(deadline)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {deadline:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def is_url(value: str) -> bool:
    return "://" in value


def check_url(url: str) -> None:
    """A store URL this machine can open: its scheme known to fsspec and its library installed."""
    if not is_url(url):
        return
    scheme = url.split("://", 1)[0]
    import fsspec

    if scheme not in fsspec.available_protocols():
        raise StoreError(
            f"{shown(url)}: no storage scheme {scheme!r}; use a folder, file://, s3://, gs://, az:// or memory://"
        )
    if scheme in _EXTRAS:
        module, extra = _EXTRAS[scheme]
        try:
            __import__(module)
        except ImportError:
            raise StoreError(
                f"{shown(url)}: {scheme}:// needs {module}: pip install 'pytest-gpuprof[{extra}]'"
            ) from None


def written_at(info: dict[str, Any]) -> float | None:
    """When the store wrote an object, from its listing: a local file's ``mtime``, an
    object store's ``LastModified``, the memory store's ``created``."""
    for field_name in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(field_name)
        if isinstance(value, dt.datetime):
            return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def timeouts(fs: Any) -> str:
    config = getattr(fs, "config_kwargs", None) or {}
    retries = config.get("retries") or {}
    attempts = retries.get("total_max_attempts") or retries.get("max_attempts") or 1
    return (
        f"connect {config.get('connect_timeout', '?')} s, read {config.get('read_timeout', '?')} s, "
        f"{attempts} attempt(s)"
    )


def reason(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())[:300]
