"""The git checkout a run or a command works in, asked one way: ``git`` (a command's output,
or a ``GitError`` naming the command and what git said), the commit and branch a report
names (``revision``) and the commit ``--gpu-autosave`` names a baseline after (``described``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from pytest_gpuprof.analysis.names import clean

# a git command that takes longer is stuck (a lock, a prompt): it is an error, not a wait
TIMEOUT_S = 120.0


class GitError(Exception):
    """A git command that could not run or that failed: the command and git's own words."""


def git(args: Sequence[str], cwd: Path, *, timeout: float = TIMEOUT_S) -> str:
    """What ``git ARGS`` prints in ``cwd``, stripped."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise GitError(f"git {' '.join(args)}: {e}") from None
    if done.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {clean(done.stderr.strip() or done.stdout.strip())[:300]}")
    return done.stdout.strip()


def tried(args: Sequence[str], cwd: Path) -> None:
    """``git ARGS`` where its failure changes nothing (a clean-up of what may not be there)."""
    try:
        git(args, cwd)
    except GitError:
        pass


def revision(folder: Path) -> dict[str, str]:
    """The commit and branch of the git checkout holding ``folder``; none outside one."""
    try:
        commit = git(["rev-parse", "HEAD"], folder, timeout=10)
        branch = git(["rev-parse", "--abbrev-ref", "HEAD"], folder, timeout=10)
    except GitError:
        return {}
    return {"commit": commit, "branch": branch} if commit and branch else {}


def described(folder: Path) -> str:
    """The checkout's short commit, ``-dirty`` where tracked files changed; ``nogit`` outside
    a checkout."""
    try:
        commit = git(["rev-parse", "--short=10", "HEAD"], folder, timeout=10)
        dirty = git(["status", "--porcelain", "--untracked-files=no"], folder, timeout=10)
    except GitError:
        return "nogit"
    if not commit:
        return "nogit"
    return commit + ("-dirty" if dirty else "")
