"""The node agent's prepare path: NodePrepareResources / NodeUnprepareResources for one driver.

- ``handler``: ``PrepareHandler``, the kubelet-facing ``DRAHandler``: maps errors per claim;
- ``claim_steps``: one claim's steps: checkpoint, plan, set-up, CDI spec, answer; unprepare; the
  start-up clean-up (``start_up``). The one place, under one lock per driver, that orders the
  checkpoint, the device set-up and the CDI spec;
- ``plan``: ``PreparePlan``, what to prepare for a claim, from its allocation results and configs;
- ``set_up``: device set-up (time slices, MPS, dynamic MIG, passthrough through ``device_setup``'s
  protocols) and its tear-down; it changes devices only;
- ``driver_node``: the driver's published devices and tools, shared by the steps;
- ``holds``: which GPUs the prepared claims hold for passthrough and which for containers (what
  the agent publishes and watches follows it);
- ``pause_points``: the test pause points (``DRA_AGENT_TEST_PAUSE_AT``);
- ``records``, ``errors``, ``metrics``: what the others share.
"""

from __future__ import annotations

from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.handler import PrepareHandler
from dra_node_agent.prepare.holds import Holds
from dra_node_agent.prepare.pause_points import PAUSE_ENV
from dra_node_agent.prepare.plan import PreparePlan

__all__ = ["PAUSE_ENV", "Holds", "PrepareError", "PrepareHandler", "PreparePlan"]
