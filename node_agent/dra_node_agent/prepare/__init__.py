"""The node agent's prepare path: NodePrepareResources / NodeUnprepareResources for one driver.

- ``handler``: ``PrepareHandler``, the kubelet-facing ``DRAHandler``: serialises calls, maps errors
  per claim, start-up clean-up (``start_up``);
- ``claim_steps``: one claim's steps: checkpoint, plan, set-up, CDI spec, answer; unprepare;
- ``plan``: ``PreparePlan``, what to prepare for a claim, from its allocation results and configs;
- ``set_up``: device set-up (time slices, MPS, dynamic MIG through ``device_setup``'s protocols)
  and its roll-back;
- ``driver_node``: the driver's published devices and tools, shared by the steps;
- ``pause_points``: the test pause points (``DRA_AGENT_TEST_PAUSE_AT``);
- ``records``, ``errors``, ``metrics``: what the others share.
"""

from __future__ import annotations

from dra_node_agent.prepare.driver_node import TpuWorkerSource
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.handler import PrepareHandler
from dra_node_agent.prepare.pause_points import PAUSE_ENV
from dra_node_agent.prepare.plan import PreparePlan

__all__ = ["PAUSE_ENV", "PrepareError", "PrepareHandler", "PreparePlan", "TpuWorkerSource"]
