"""Which discovery backends run on this node (``detect``), and ``python -m dra_node_agent.discovery``.

The backends themselves live with their vendor (``nvidia.discovery``, ``tpu.discovery``,
``simulated.discovery``); what they report is ``dra_node_agent.devices``.
"""
