"""pytest-gpuprof's start-up hook for the processes a test starts (``capture.children``).

It does nothing unless the test set ``PYTEST_GPUPROF_CHILDREN``; then this process records
its device work for the test. Either way, a ``sitecustomize`` of the process's own further
along the path runs after it, as it would have without this one.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _pytest() -> bool:
    """Whether this process is a pytest run: it has the plugin, which records its own work."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return any(a == "pytest" or a.endswith(("/pytest", "/py.test")) for a in argv[:3])


def _trace() -> None:
    folder = os.environ.get("PYTEST_GPUPROF_CHILDREN")
    if not folder:
        return
    if _pytest():
        # its plugin traces its own tests' children; its xdist workers (started as
        # ``python -c``) must not take CUPTI from it as the outer test's children
        del os.environ["PYTEST_GPUPROF_CHILDREN"]
        return
    try:
        from pytest_gpuprof.capture.children import start_in_child

        start_in_child(folder)
    except Exception as e:  # never break the child: say why in its record instead
        _refused(folder, f"start-up hook failed: {e!r}")


def _refused(folder: str, why: str) -> None:
    """``PID.json`` saying why, written only into the test's own folder (a real folder of
    this user's that no one else can write in), as a new file, never through a link."""
    import json
    import stat

    try:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return
        path = os.path.join(folder, f"{os.getpid()}.json")
        tmp = f"{path}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"command": " ".join(sys.argv)[:300], "refused": why}, out)
        os.replace(tmp, path)
    except Exception:
        pass


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_trace()
_chain()
