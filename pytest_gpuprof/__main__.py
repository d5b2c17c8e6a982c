"""``python -m pytest_gpuprof`` is the ``gpuprof`` command."""

import sys

from pytest_gpuprof.cli import main

sys.exit(main())
