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
        try:
            import json

            with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
                json.dump({"command": " ".join(sys.argv)[:300], "refused": f"start-up hook failed: {e!r}"}, out)
        except OSError:
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
