"""The device side of a session: which backend, on which device, its NVML sampler, the
header lines that say so, and closing them.

Nothing starts until something asks: ``select`` only decides (and is run at start-up
where the run configures the plugin, so the header can name the backend); ``backend``
creates it, calling ``on_start`` first.
"""

from __future__ import annotations

import contextlib
import platform
import sys
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gpuprof.harness import xdist
from pytest_gpuprof.harness.config import Settings

if TYPE_CHECKING:
    from pytest_gpuprof.capture import backends
    from pytest_gpuprof.capture.backends import Kind
    from pytest_gpuprof.capture.device import GpuDevice
    from pytest_gpuprof.capture.exclusive import DeviceLock
    from pytest_gpuprof.capture.gpm import Gpm
    from pytest_gpuprof.capture.nvml import NvmlSampler
    from pytest_gpuprof.capture.placement import Placement
    from pytest_gpuprof.capture.stacks import StackSampler
    from pytest_gpuprof.output.report import Machine


class DeviceRuntime:
    def __init__(self, config: pytest.Config, settings: Settings, placed: Placement | None = None) -> None:
        self.config = config
        self.settings = settings  # as resolved at start-up: never replaced
        # this xdist worker's GPU, where it was spread over several (``capture.placement``)
        self.placed = placed
        self._selected: tuple[Kind, str, int] | None = None  # backend, why, device index
        self._backend: backends.Backend | None = None
        self._lock: DeviceLock | None = None
        self._machine: Machine | None = None
        self._device_facts: dict[str, str] | None = None  # the GPU's hashed UUID and power limit, read once
        if settings.configured:
            self.select()

    def select(self) -> tuple[Kind, str, int]:
        """The backend's kind, why it was chosen, and this process's device index."""
        if self._selected is None:
            from pytest_gpuprof.capture import backends

            try:
                # the device asked for is the one probed (and named in the header); under
                # --gpu-devices, any device tells whether CUDA is here, then this worker's is
                probed = self.settings.device if self.settings.devices is None else 0
                kind, reason = backends.select(self.settings.backend, probed)
                count = backends.cuda_device_count() if kind.gpu else None
                device = pick_device(self.settings, self.config, count)
                if count is not None and device >= count:
                    raise RuntimeError(f"--gpu-device={device}, but only {count} device(s) are visible")
                if not kind.gpu and self.settings.devices is None and device != 0:
                    raise RuntimeError(
                        f"--gpu-device={device}: the host backend has one device, 0 (the backend is host: {reason})"
                    )
                if kind.gpu and device != probed:
                    kind, reason = backends.select(self.settings.backend, device)
            except RuntimeError as e:
                raise pytest.UsageError(f"pytest-gpuprof: {e}") from None
            self._selected = kind, reason, device
        return self._selected

    @property
    def chosen(self) -> bool:
        """Whether the backend is chosen (and named in the header); nothing runs yet."""
        return self._selected is not None

    @property
    def device_index(self) -> int:
        """This process's device (``--gpu-device``, or this xdist worker's of ``--gpu-devices``)."""
        return self.select()[2]

    @property
    def device_number(self) -> int:
        """The device as the caller numbers it: this worker's place among the GPUs the
        caller's ``CUDA_VISIBLE_DEVICES`` lists where it was spread, else its index."""
        if self.placed is not None and self.kind.gpu:
            return self.placed.number
        return self.device_index

    @property
    def kind(self) -> Kind:
        """What the chosen backend can do (``capture.backends.Kind``)."""
        return self.select()[0]

    @property
    def virtual(self) -> bool:
        """Whether the backend runs on a virtual clock: its figures do not depend on what
        else runs, and no stack sampler or device lock has anything to do."""
        return self.kind.virtual(self.settings.host_clock)

    @property
    def backend_reason(self) -> str:
        return self.select()[1]

    @property
    def is_worker(self) -> bool:
        return xdist.of(self.config).worker is not None

    @property
    def runs_tests(self) -> bool:
        """False for ``--collect-only`` and for a pytest-xdist controller: nothing to measure here."""
        controller = getattr(self.config.option, "dist", "no") != "no" and not self.is_worker
        return not (self.config.option.collectonly or controller)

    @property
    def backend(self) -> backends.Backend:
        if self._backend is None:
            self.start()
        assert self._backend is not None
        return self._backend

    def start(self) -> float:
        """Start the backend where it is not running; the time waited for the device (ms).

        Starting is device work (a CUDA context takes device memory, CUPTI starts): never
        under another process's window. Where this process does not hold the device, it
        starts under a shared hold, beside other processes' starts (``DeviceLock.starting``).
        """
        if self._backend is not None:
            return 0.0
        from pytest_gpuprof.capture import backends

        s = self.settings
        lock = self.lock()
        starting = lock.starting() if lock is not None and not lock.held else contextlib.nullcontext(0.0)
        with starting as waited:
            self._backend = backends.create(
                self.kind, self.device_index, cupti=s.cupti, clock=s.host_clock, nvtx=s.nvtx
            )
        return waited

    def lock(self) -> DeviceLock | None:
        """The device's lock among this plugin's processes (``--gpu-exclusive=auto``), or
        ``None``: switched off, or the host backend's virtual clock, whose figures do not
        depend on what else runs."""
        if not self.settings.exclusive:
            return None
        if self.virtual:
            return None
        if self._lock is None:
            from pytest_gpuprof.capture.exclusive import DeviceLock

            # xdist's workers of one run share its id: they queue for the device, never time out on each other
            run = xdist.of(self.config).run
            self._lock = DeviceLock(self._device_key(), timeout_s=self.settings.lock_timeout_s, say=self._say, run=run)
        return self._lock

    def _say(self, line: str) -> None:
        """A line the user must see while a test waits (the terminal, else stderr)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def _device_key(self) -> str:
        """What names the device host-wide: a GPU's UUID, read from NVML without a CUDA
        context (this process may not hold the device yet)."""
        if not self.kind.gpu:
            return f"host-{platform.node()}"
        from pytest_gpuprof.capture import nvml

        return nvml.uuid(self.device_index) or f"cuda-pci-{self.device_index}"

    def hold(self, who: str, *, start: bool = False) -> tuple[float, str]:
        """Hold the device for ``who`` until ``let_go``: the time waited (ms), and whom for.

        ``start``: start the backend first, beside other processes' starts (under the hold
        they would take turns at it); where it cannot start, the test's set-up says why."""
        started_ms = 0.0
        if start and not self.started:
            from pytest_gpuprof.capture.exclusive import LockError

            try:
                started_ms = self.start()
            except LockError:
                raise  # the wait given up on: acquire would be refused with it at once
            except Exception:  # acquire's set-up names why it cannot start
                pass
        lock = self.lock()
        waited_ms, holder = (0.0, "") if lock is None else lock.acquire(who)
        return started_ms + waited_ms, holder

    def let_go(self) -> None:
        if self._lock is not None:
            self._lock.release()

    @property
    def started(self) -> bool:
        """Whether the backend runs: the one meaning of "started" (a CUDA context, CUPTI)."""
        return self._backend is not None

    @property
    def truth(self) -> str:
        return self._backend.source.kind.name if self._backend is not None else ("?" if self.kind.gpu else "host")

    @cached_property
    def device(self) -> GpuDevice:
        from pytest_gpuprof.capture.device import GpuDevice

        return GpuDevice(self.backend, self.backend.info(), self._shared_rates())

    def _shared_rates(self) -> tuple[Path, str] | None:
        """Where the workers of one xdist run keep the device's calibrated rates: beside the
        device's lock, under which each calibration runs alone; ``None`` outside such a run."""
        facts = xdist.of(self.config)
        run = facts.run if facts.worker else None
        lock = self.lock()
        if not run or lock is None:
            return None
        return lock.path.with_suffix(".rates.json"), str(run)

    @cached_property
    def sampler(self) -> NvmlSampler | None:
        if not self.settings.nvml or not self.kind.gpu:
            return None
        from pytest_gpuprof.capture.nvml import NvmlSampler

        return NvmlSampler.start(self.device_index, self.settings.nvml_interval_ms)

    @cached_property
    def stacks(self) -> StackSampler | None:
        """The host's stack sampler, on a real clock only (virtual time is not the
        sampler's)."""
        if not self.settings.sample or self.virtual:
            return None
        from pytest_gpuprof.capture.stacks import StackSampler

        return StackSampler()

    @cached_property
    def _gpm(self) -> tuple[Gpm | None, str]:
        if not self.settings.nvml:
            return None, "off (--gpu-no-nvml)"
        if not self.kind.gpu:
            return None, f"off ({self.kind.name} backend)"
        from pytest_gpuprof.capture.gpm import Gpm

        return Gpm.start(self.device_index)

    @property
    def gpm(self) -> Gpm | None:
        return self._gpm[0]

    @property
    def gpm_status(self) -> str:
        return self._gpm[1]

    def nvml_status(self) -> str:
        if not self.settings.nvml:
            return "off (--gpu-no-nvml)"
        if not self.kind.gpu:
            return f"off ({self.kind.name} backend: no GPU to sample)"
        from pytest_gpuprof.capture.nvml import probe

        return probe(self.device_index)

    def machine(self) -> Machine:
        """The machine record of this process's reports, as the project's
        ``pytest_gpuprof_machine_info`` hooks left it (asked once)."""
        if self._machine is None:
            from pytest_gpuprof.output.report import machine_record

            clock = "virtual" if self.virtual else "real"
            record = machine_record(self.device.to_dict(), self.truth, clock)
            self.config.hook.pytest_gpuprof_machine_info(config=self.config, machine=record)
            self._machine = record
        return self._machine.copy()

    def environment(self) -> dict[str, str]:
        """What besides the code changes kernel times, as it is now (``capture.environment``):
        the loaded libraries read each time, the device's facts once."""
        from pytest_gpuprof.capture import environment

        if self._device_facts is None and self.kind.gpu and self._backend is not None:
            self._device_facts = environment.device_facts(self.device_index)
        clock = {"host clock": "virtual" if self.virtual else "real"}
        return {**environment.loaded_versions(), **(self._device_facts or {}), **clock}

    def close(self) -> None:
        if "sampler" in self.__dict__ and self.sampler is not None:
            self.sampler.stop()
        if "stacks" in self.__dict__ and self.stacks is not None:
            self.stacks.stop()
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def pick_device(settings: Settings, config: pytest.Config, cuda_devices: int | None) -> int:
    """``--gpu-devices`` spreads xdist workers over devices (worker i on device i mod
    the count); host 'devices' are logical slots, one per worker."""
    if settings.devices is None:
        return settings.device
    facts = xdist.of(config)
    index = facts.number
    if settings.devices == "all":
        count = cuda_devices if cuda_devices is not None else facts.workers
        devices: tuple[int, ...] = tuple(range(max(count, 1)))
    else:
        assert not isinstance(settings.devices, str)
        devices = settings.devices
    return devices[index % len(devices)]
