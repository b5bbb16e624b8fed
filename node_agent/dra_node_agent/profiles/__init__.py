"""Simulated-hardware profiles (YAML), loaded by `dra_node_agent.simulated.discovery`."""
