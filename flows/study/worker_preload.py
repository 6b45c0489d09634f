"""Dask preload of the study's local worker processes (``LocalCluster(preload=[...])``).

:func:`dask_setup` runs in each worker process as it starts, before it takes a task, and moves
the process (and so everything a point starts in it) into a process group of its own. A Ctrl-C
in the terminal signals the terminal's process group: without this the workers, which
``multiprocessing`` starts in the CLI's group, would each print a page of ``KeyboardInterrupt``
tracebacks over the CLI's one line. The CLI stops them itself (``flows.dvcops.stop_descendants``
walks the process tree, not the group).
"""

from __future__ import annotations

import os
from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: the worker process leads a new process group."""
    os.setpgid(0, 0)
