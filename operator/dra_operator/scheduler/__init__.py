"""Coexistence with kube-scheduler: giving way, waiting, and reserving devices for a claim that
waited too long."""
