"""The control plane a benchmark runs on: one of its own, started for the run and stopped after
(what ``python -m bench.<name>`` does), or one it is given (the smoke tests give theirs, so that a
test session starts no extra control plane per benchmark). A given cluster is left running."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra_devcluster import LocalCluster


@contextlib.contextmanager
def cluster_for(given: LocalCluster | None, *, prefix: str, **kwargs: Any) -> Iterator[LocalCluster]:
    """``given``, or a fresh :class:`LocalCluster` (``kwargs`` passed on) in a new folder named
    with ``prefix`` under the temporary directory, which stays for its logs."""
    if given is not None:
        yield given
        return
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    with LocalCluster(workdir=workdir / "cluster", **kwargs) as cluster:
        # The benchmark's clients use the cluster's kubeconfig, never one from the environment.
        os.environ.pop("KUBECONFIG", None)
        yield cluster
