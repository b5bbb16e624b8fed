"""Joining this node to ComputeDomains: the compute-domain driver's ``DomainMembership``.

A channel claim (``channel-0``, with a ``ComputeDomainChannelConfig``):

- its domain must exist and not be being deleted, and the claim must be in the domain's namespace
  (a claim of another namespace naming someone's domain is refused, every time);
- the node gets the label ``resource.nvidia.com/computeDomain=<domain UID>``, which pulls the
  domain's daemon onto it. A node holds one domain at a time: channel 0 is held by one claim (the
  checkpoint refuses a second), and a label of another domain that no prepared channel holds any
  more is stale and replaced;
- its containers get ``/dev/nvidia-caps-imex-channels/channel0`` (allocationMode All: every
  channel), made by the runtime from the major ``/proc/devices`` gives; on a node without NVLink
  fabric, nothing;
- after prepare, ``wait_ready`` waits, within the kubelet's budget, until the daemon on this node
  is Ready in the domain's clique (or, without fabric, in the domain's status).

A daemon claim (``daemon-0``, with a ``ComputeDomainDaemonConfig``) must be in the driver's
namespace, where the controller makes the daemons' claims: no other claim can name a domain's folder.
It gets that folder (``<plugins>/compute-domain.nvidia.com/domains/<UID>``, 0700, with the IMEX
config template) at ``/imexd``, the domain's identity and clique in its environment, the driver's
files (``nvidia-imex`` among them) and, with a clique, the ``fabric-imex-mgmt`` capability.

With host-managed IMEX (the hosts run ``nvidia-imex``): no label and no daemon; a channel's prepare
asks the host's daemon (``nvidia-imex-ctl -q``) and needs READY; every claim gets channel 0 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_api import computedomains as cd
from dra_node_agent.checkpoint import atomic_write_file
from dra_node_agent.device_setup import DeviceSetupError, Membership
from dra_node_agent.devices import ContainerEdits, Mount
from dra_node_agent.nvidia import imex_config
from dra_node_agent.nvidia.cd_api import ApiUnavailable, DomainApi
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend, NodeFabric, channel_nodes

logger = logging.getLogger(__name__)

DOMAINS_FOLDER: Final = "domains"
# How often a waiting prepare asks whether this node's daemon is ready.
READY_POLL_S: Final = 1.0
# How long a prepare waits for the first listing of ComputeDomains.
LISTING_WAIT_S: Final = 10.0
# How often the node's NVLink clique label is put right.
CLIQUE_LABEL_INTERVAL_S: Final = 600.0
IMEX_CTL: Final = ("usr/bin/nvidia-imex-ctl", "usr/sbin/nvidia-imex-ctl", "bin/nvidia-imex-ctl")
IMEX_CTL_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class HostImex:
    """Host-managed IMEX: where the host's daemon answers (its unix socket)."""

    socket: str


class ComputeDomainMembership:
    """The compute-domain driver's set-up of channels and daemons (see the module docstring)."""

    def __init__(
        self,
        *,
        backend: ComputeDomainBackend,
        api: DomainApi,
        plugins_dir: Path,
        host_imex: HostImex | None = None,
        clique_label: bool = True,
    ) -> None:
        self.backend = backend
        self.api = api
        self.folder = plugins_dir / cd.DRIVER / DOMAINS_FOLDER
        self.host_imex = host_imex
        self.clique_label = clique_label

    @property
    def fabric(self) -> NodeFabric:
        fabric = self.backend.fabric
        if fabric is None:
            raise DeviceSetupError("this node's NVLink fabric is not known yet (discovery has not succeeded)")
        return fabric

    # -- join ---------------------------------------------------------------------------------------

    async def join(self, member: Membership, *, others: Sequence[tuple[str, str]]) -> ContainerEdits:
        if member.device.kind == "daemon":
            return await self._join_daemon(member)
        return await self._join_channel(member, others=others)

    async def _domain(self, member: Membership) -> cd.ComputeDomain:
        try:
            domain = await self.api.domain(member.domain, wait_s=LISTING_WAIT_S)
        except ApiUnavailable as exc:
            raise DeviceSetupError(f"ComputeDomain {member.domain}: {exc}") from exc
        if domain is None:
            raise DeviceSetupError(f"no ComputeDomain has UID {member.domain} (deleted, or not created yet)")
        return domain

    async def _join_channel(self, member: Membership, *, others: Sequence[tuple[str, str]]) -> ContainerEdits:
        domain = await self._domain(member)
        if member.namespace != domain.namespace:
            raise DeviceSetupError(
                f"refused: the claim is in namespace {member.namespace} and ComputeDomain {domain.key} in "
                f"namespace {domain.namespace}; a channel claim must be in its domain's namespace"
            )
        if domain.deleting:
            raise DeviceSetupError(f"ComputeDomain {domain.key} is being deleted; no new channel joins it")
        fabric = self.fabric
        if self.host_imex is not None:
            if fabric.clique_id:
                await self._host_ready()
            return self._channel_edits(fabric, count=1)
        # Only channels hold a node: a daemon claim (of this domain, or of one the node is leaving)
        # follows the label, it does not keep it.
        held = sorted({d for name, d in others if name != cd.DAEMON_DEVICE and d != domain.uid})
        # Channel 0 is one claim's at a time, so another domain held here means a stale record.
        if held:
            raise DeviceSetupError(
                f"node {self.api.node_name} is in ComputeDomain {held[0]} (a prepared claim holds its "
                "channel); a node serves one ComputeDomain at a time"
            )
        try:
            before = await self.api.set_node_label(cd.DOMAIN_LABEL, domain.uid)
        except ApiUnavailable as exc:
            raise DeviceSetupError(str(exc)) from exc
        if before not in (None, domain.uid):
            logger.warning(
                "node %s: replaced the stale label of ComputeDomain %s (no prepared channel holds it) "
                "with %s",
                self.api.node_name,
                before,
                domain.key,
            )
        count = cd.MAX_IMEX_CHANNELS if member.all_channels else 1
        return self._channel_edits(fabric, count=count)

    def _channel_edits(self, fabric: NodeFabric, *, count: int) -> ContainerEdits:
        if not fabric.clique_id or fabric.channel_major is None:
            return ContainerEdits()  # no NVLink fabric: the claim is prepared with no device
        return ContainerEdits(device_nodes=channel_nodes(fabric.channel_major, count))

    async def _join_daemon(self, member: Membership) -> ContainerEdits:
        if self.host_imex is not None:
            raise DeviceSetupError("refused: the hosts run IMEX (host-managed), so no daemon claim is served")
        if member.namespace != self.api.namespace:
            raise DeviceSetupError(
                "refused: a ComputeDomain daemon claim must be in the driver's namespace "
                f"{self.api.namespace}, not {member.namespace}"
            )
        domain = await self._domain(member)
        folder = self.folder / domain.uid
        await asyncio.to_thread(_make_folder, folder)
        fabric = self.fabric
        edits = ContainerEdits(
            env=(
                f"CLIQUE_ID={fabric.clique_id}",
                f"COMPUTE_DOMAIN_UUID={domain.uid}",
                f"COMPUTE_DOMAIN_NAME={domain.name}",
                f"COMPUTE_DOMAIN_NAMESPACE={domain.namespace}",
            ),
            mounts=(Mount(host_path=str(folder), container_path=imex_config.FOLDER, read_only=False),),
        )
        edits = edits.merged(fabric.driver_edits).merged(fabric.simulated_daemon_edits)
        if fabric.clique_id and fabric.imex_mgmt is not None:
            edits = edits.merged(ContainerEdits(device_nodes=(fabric.imex_mgmt,)))
        return edits

    async def _host_ready(self) -> None:
        """The host's IMEX daemon must say READY (host-managed IMEX)."""
        assert self.host_imex is not None
        root = self.backend.driver_root
        found = await asyncio.to_thread(lambda: [root / p for p in IMEX_CTL if (root / p).is_file()])
        tool = found[0] if found else None
        if tool is None:
            raise DeviceSetupError(f"nvidia-imex-ctl is not under the driver root {self.backend.driver_root}")
        try:
            process = await asyncio.create_subprocess_exec(
                str(tool),
                "-q",
                f"--u={self.host_imex.socket}",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(process.communicate(), timeout=IMEX_CTL_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise DeviceSetupError(f"asking the host's IMEX daemon failed: {exc}") from exc
        answer = out.decode(errors="replace").strip()[:200]
        if process.returncode != 0 or answer != "READY":
            raise DeviceSetupError(f"the host's IMEX daemon is not ready: {answer or 'no answer'}")

    # -- leave --------------------------------------------------------------------------------------

    async def leave(self, *, device: str, domain: str, others: Sequence[tuple[str, str]]) -> None:
        if device == cd.DAEMON_DEVICE:
            if not any(d == domain and name == cd.DAEMON_DEVICE for name, d in others):
                await asyncio.to_thread(shutil.rmtree, self.folder / domain, True)
            return
        # Another channel of the domain keeps the label; the domain's daemon claim does not: it is
        # there because of the label, and goes (its DaemonSet pod leaves) once the label does.
        if self.host_imex is not None or any(d == domain and name != cd.DAEMON_DEVICE for name, d in others):
            return
        try:
            await self.api.set_node_label(
                cd.DOMAIN_LABEL, None, unless=lambda now: "" if now == domain else "not ours"
            )
        except ValueError:
            return  # the label names another domain now, or none: not this claim's to remove
        except ApiUnavailable as exc:
            raise DeviceSetupError(str(exc)) from exc

    # -- readiness ----------------------------------------------------------------------------------

    async def wait_ready(self, *, claim: str, domain: str, budget_s: float) -> None:
        if self.host_imex is not None:
            return  # asked at prepare: the host's daemon was READY
        deadline = time.monotonic() + budget_s
        last = "not known yet"
        while True:
            try:
                found = await self.api.domain(
                    domain, wait_s=max(0.1, min(LISTING_WAIT_S, deadline - time.monotonic()))
                )
            except ApiUnavailable as exc:
                found, last = None, str(exc)
            else:
                if found is None:
                    raise DeviceSetupError(f"ComputeDomain {domain} no longer exists")
                ready, last = await self._ready_here(found)
                if ready:
                    return
            if time.monotonic() + READY_POLL_S > deadline:
                raise DeviceSetupError(
                    f"ComputeDomain {found.key if found else domain}: the IMEX daemon on node "
                    f"{self.api.node_name} is not ready ({last}) after {budget_s:.0f} s; "
                    "the kubelet asks again"
                )
            await asyncio.sleep(READY_POLL_S)

    async def _ready_here(self, domain: cd.ComputeDomain) -> tuple[bool, str]:
        """Whether this node's daemon is Ready, in its clique or (without fabric) in the status."""
        node = self.api.node_name
        clique_id = self.fabric.clique_id
        try:
            if clique_id:
                clique = await self.api.clique(cd.clique_name(domain.uid, clique_id))
                daemon = next((d for d in clique.daemons if d.name == node), None) if clique else None
                if daemon is None:
                    return False, f"not in clique {clique_id} yet"
                return daemon.ready, f"{daemon.status} in clique {clique_id}"
            fresh = await self.api.fresh_domain(domain)
        except ApiUnavailable as exc:
            return False, str(exc)
        entry = fresh.node(node) if fresh else None
        if entry is None:
            return False, "not in the domain's status yet"
        return entry.ready, f"{entry.status} in the domain's status"

    # -- the node's clique label --------------------------------------------------------------------

    async def run(self) -> None:
        """Keep ``nvidia.com/gpu.clique`` on this node as its GPUs' fabric says."""
        if not self.clique_label:
            return
        while True:
            fabric = self.backend.fabric
            if fabric is not None:
                try:
                    await self.api.set_node_label(cd.GPU_CLIQUE_LABEL, fabric.clique_id or None)
                except (ApiUnavailable, ValueError) as exc:
                    logger.warning("setting node label %s failed: %s", cd.GPU_CLIQUE_LABEL, exc)
                    await asyncio.sleep(30.0)
                    continue
            await asyncio.sleep(CLIQUE_LABEL_INTERVAL_S if fabric is not None else 5.0)

    async def aclose(self) -> None:
        await self.api.aclose()


def _make_folder(folder: Path) -> None:
    """A domain's folder, root's only, with the IMEX config template (blocking)."""
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    if folder.is_symlink() or not folder.is_dir():
        raise DeviceSetupError(f"{folder} is not a folder")
    os.chmod(folder, 0o700)
    # Replaced, never written through: the daemon's container writes in this folder too.
    atomic_write_file(folder / imex_config.TEMPLATE_NAME, imex_config.TEMPLATE_TEXT.encode(), mode=0o644)
