"""dra_operator."""
