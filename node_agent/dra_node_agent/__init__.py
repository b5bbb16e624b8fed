"""dra_node_agent."""
