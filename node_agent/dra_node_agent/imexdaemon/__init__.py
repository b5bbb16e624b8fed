"""``compute-domain-daemon``: the IMEX daemon wrapper a ComputeDomain's DaemonSet runs on each node.

``run`` joins the domain's clique, renders the IMEX config, keeps ``/etc/hosts`` mapping the
clique's DNS names to the daemons' addresses, supervises ``nvidia-imex`` and reports its readiness
in the clique; on a node without NVLink fabric it labels its pod and idles. ``check`` is the pod's
probe. See docs/compatibility.md#computedomains.
"""
