"""A simulated GPU node for prepare tests: its hardware (the fake NVML and the driver root's
stand-ins) and state folders under one temporary folder, and handlers over them as an agent start
would build them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_node_agent import prepare_tools
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, Claims


class SimulatedNode:
    def __init__(
        self,
        tmp_path: Path,
        *,
        profile: str | Path = "h100-80gb-x8",
        dynamic_mig: bool = False,
        passthrough: bool = False,
    ) -> None:
        self.tmp_path = tmp_path
        self.backend = SimulatedBackend(
            profile=profile,
            node_name=NODE,
            state_dir=tmp_path / "hw",
            driver=GPU,
            dynamic_mig=dynamic_mig,
            passthrough=passthrough,
        )
        self.claims = Claims(GPU)
        (tmp_path / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
        self.handlers: list[PrepareHandler] = []

    async def handler(self, **components: Any) -> PrepareHandler:
        """A fresh handler over the same hardware and state (an agent (re)start); ``components``
        are the handler's optional parts (gpu_sharing, mps, dynamic_mig, passthrough). The vendor's
        container environment is the one the agent's wiring picks for these GPUs."""
        components.setdefault("vendor_env", prepare_tools.vendor_env(self.backend))
        handler = PrepareHandler(
            driver=GPU,
            node_name=NODE,
            inventory=await self.backend.discover(),
            claims=self.claims,
            state_dir=self.tmp_path / "state",
            cdi_dir=self.tmp_path / "cdi",
            proc_root=self.tmp_path / "proc",
            **components,
        )
        await handler.start()
        self.handlers.append(handler)
        return handler
