"""What pytest-xdist says of this process, read in one place: whether it is a worker, its
id and the number of workers, the run's id that its workers share (``of``), and whether
this process controls a run spread over workers (``controls``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Xdist", "controls", "of"]


@dataclass(frozen=True, slots=True)
class Xdist:
    worker: str | None  # "gw3"; None: not a worker (a controller, or no xdist)
    workers: int  # the run's workers (1 outside xdist)
    run: str | None  # the id every worker of one run shares

    @property
    def number(self) -> int:
        """The worker's number (gw3: 3), 0 outside a worker."""
        return int(self.worker[2:]) if self.worker else 0


def of(config: Any) -> Xdist:
    """``config``'s xdist facts (``workerinput`` in a worker, its options in a controller)."""
    given = getattr(config, "workerinput", None)
    if given is not None:
        run = given.get("testrunuid") or os.environ.get("PYTEST_XDIST_TESTRUNUID")
        return Xdist(given.get("workerid"), int(given.get("workercount", 1)), run)
    return Xdist(None, 1, os.environ.get("PYTEST_XDIST_TESTRUNUID"))


def controls(config: Any) -> bool:
    """Whether this process is the controller of a run spread over workers (its options)."""
    if getattr(config, "workerinput", None) is not None:
        return False
    return bool(config.getoption("numprocesses", None) or config.getoption("dist", "no") not in ("no", None))
