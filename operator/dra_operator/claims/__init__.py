"""The claim path: the worker that takes a claim from the queue, the parts that allocate, release
and re-list, and the one place that applies their outcomes."""
