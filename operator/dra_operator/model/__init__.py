"""What the operator knows: the cluster model, the claim book, the queue, which claims are its own,
and the metrics that count them."""
