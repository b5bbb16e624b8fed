"""``kubectl dra``: the cluster's devices, claims and allocation explanations, as kubectl prints them.

The console script ``kubectl-dra`` makes ``kubectl dra devices|claims|explain`` work when it is on
PATH. It lives in the operator's package because it reads the cluster as the operator does (one
list per kind through :class:`dra_operator.client.kubeapi.KubeApi`, in the served resource.k8s.io version)
and explains claims with the operator's own planner and allocator (through
:func:`dra_operator.entry.simulate.plan`), so its text is the text the operator writes. It never writes to
the cluster.

Modules: :mod:`.cluster` (reading the cluster into typed objects), :mod:`.devices`, :mod:`.claims`
and :mod:`.explain` (the three subcommands' rows and text, pure functions of those objects),
:mod:`.output` (kubectl-style tables, JSON and YAML), :mod:`.cli` (flags, exit codes, errors).
"""

from __future__ import annotations

from dra_operator.kubectl_dra.cli import main

__all__ = ["main"]
