"""dra_api."""
