"""NVIDIA's compute-domain driver on a simulated node: what it publishes from the fake NVML's NVLink
fabric, and how it prepares channel and daemon claims.

The hardware is the simulated GPU node (a GB200 tray in a multi-node clique, or an H100 host whose
fabric joins nothing beyond itself). The API server's side of the driver (``cd_api.DomainApi``: the
domains, cliques and this node's labels) is an in-memory stand-in here, which keeps its labels the
way the real client does (``unless`` refuses, ``None`` removes); the client itself is exercised
against the real API server in the integration tests.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, cast

import pynvml
import pytest

from dra_api import computedomains as cd
from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.nvidia import fabric as fabric_info
from dra_node_agent.nvidia import imex_config
from dra_node_agent.nvidia.cd_api import DomainApi
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend
from dra_node_agent.nvidia.cd_membership import ComputeDomainMembership, HostImex
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated import record as simulated_record
from dra_node_agent.simulated.cd_backend import SimulatedComputeDomainBackend
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.simulated.faketree import IMEX_CHANNELS_MAJOR
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, Claims, entry

GB200_CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"
DOMAIN_UID = "0b6a1a1e-2f4c-4d5e-8f90-123456789abc"
OTHER_UID = "7d0c2b3a-1111-4222-8333-444455556666"
TENANT = "team-a"
DRIVER_NS = "accel-dra"


class DomainsInMemory:
    """What the API server holds for the driver: domains by UID, cliques by name, this node's labels."""

    def __init__(self) -> None:
        self.node_name = NODE
        self.namespace = DRIVER_NS
        self.domains: dict[str, cd.ComputeDomain] = {}
        self.cliques: dict[str, cd.Clique] = {}
        self.labels: dict[str, str] = {}

    def add_domain(self, uid: str, *, namespace: str = TENANT, deleting: bool = False) -> cd.ComputeDomain:
        meta: dict[str, Any] = {"namespace": namespace, "name": f"cd-{uid[:4]}", "uid": uid}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
        domain = cd.ComputeDomain.from_json(
            {"metadata": meta, "spec": {"channel": {"resourceClaimTemplate": {"name": "channel"}}}}
        )
        self.domains[uid] = domain
        return domain

    def daemon_ready(self, uid: str, clique_id: str, *, status: str = cd.READY) -> None:
        node = cd.DomainNode(name=NODE, ip_address="10.0.0.7", clique_id=clique_id, index=0, status=status)
        name = cd.clique_name(uid, clique_id)
        self.cliques[name] = cd.Clique(
            namespace=DRIVER_NS, name=name, domain_uid=uid, clique_id=clique_id, daemons=(node,)
        )

    async def domain(self, uid: str, *, wait_s: float) -> cd.ComputeDomain | None:
        return self.domains.get(uid)

    async def fresh_domain(self, domain: cd.ComputeDomain) -> cd.ComputeDomain | None:
        return self.domains.get(domain.uid)

    async def clique(self, name: str) -> cd.Clique | None:
        return self.cliques.get(name)

    async def node_label(self, key: str) -> tuple[str | None, str]:
        return self.labels.get(key), "1"

    async def set_node_label(self, key: str, value: str | None, *, unless: Any = None) -> str | None:
        current = self.labels.get(key)
        if unless is not None and (reason := unless(current)):
            raise ValueError(reason)
        if value is None:
            self.labels.pop(key, None)
        else:
            self.labels[key] = value
        return current

    async def aclose(self) -> None:
        pass


class DomainNode:
    """A simulated node serving the compute-domain driver, as the agent wires it."""

    def __init__(self, tmp_path: Path, *, profile: str = "gb200-nvl-x4", host_managed: bool = False) -> None:
        self.tmp_path = tmp_path
        self.host_socket = tmp_path / "imex_ctrl.sock" if host_managed else None
        gpus = SimulatedBackend(profile=profile, node_name=NODE, state_dir=tmp_path / "hw", driver=GPU)
        self.simulated = SimulatedComputeDomainBackend(gpus, host_managed=host_managed, strict_fabric=True)
        backend = self.simulated.hardware().backend
        assert isinstance(backend, ComputeDomainBackend)
        self.backend = backend
        self.api = DomainsInMemory()
        self.claims = Claims(cd.DRIVER)
        self.plugins = tmp_path / "plugins"
        (tmp_path / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")

    async def handler(self, *, ready_budget_s: float = 0.0, domains: bool = True) -> PrepareHandler:
        membership = ComputeDomainMembership(
            backend=self.backend,
            api=cast(DomainApi, self.api),
            plugins_dir=self.plugins,
            host_imex=HostImex(socket=str(self.host_socket)) if self.host_socket else None,
        )
        handler = PrepareHandler(
            driver=cd.DRIVER,
            node_name=NODE,
            inventory=await self.simulated.discover(),
            claims=self.claims,
            state_dir=self.tmp_path / "state",
            cdi_dir=self.tmp_path / "cdi",
            proc_root=self.tmp_path / "proc",
            domains=membership if domains else None,
            ready_budget_s=ready_budget_s,
        )
        await handler.start()
        return handler

    def add_claim(
        self,
        name: str,
        *,
        device: str = cd.CHANNEL_DEVICE,
        namespace: str = TENANT,
        config: dict[str, Any] | None = None,
    ) -> ClaimRef:
        uid = f"uid-{name}"
        request = cd.CHANNEL_REQUEST if device == cd.CHANNEL_DEVICE else cd.DAEMON_REQUEST
        configs = [entry(cd.DRIVER, config, source="FromClass")] if config is not None else []
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": request, "driver": cd.DRIVER, "pool": NODE, "device": device}
                        ],
                        "config": configs,
                    }
                }
            },
        }
        return ClaimRef(namespace=namespace, name=name, uid=uid)

    def spec(self, ref: ClaimRef) -> dict[str, Any] | None:
        specs = [p for p in (self.tmp_path / "cdi").glob("*.json") if ref.uid in p.name]
        return json.loads(specs[0].read_text()) if specs else None


def channel_config(uid: str = DOMAIN_UID, mode: str = cd.SINGLE) -> dict[str, Any]:
    return {"apiVersion": NVIDIA, "kind": cd.CHANNEL_CONFIG_KIND, "domainID": uid, "allocationMode": mode}


def daemon_config(uid: str = DOMAIN_UID) -> dict[str, Any]:
    return {"apiVersion": NVIDIA, "kind": cd.DAEMON_CONFIG_KIND, "domainID": uid}


# -- what the node publishes -------------------------------------------------------------------------


def test_a_gb200_tray_publishes_channel_0_and_daemon_0_and_knows_its_clique(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    inventory = node.simulated.discover_sync()
    assert inventory.driver == cd.DRIVER
    assert inventory.available
    published = {d.name: d for d in inventory.devices}
    assert sorted(published) == [cd.CHANNEL_DEVICE, cd.DAEMON_DEVICE]
    assert {k: a.to_json() for k, a in published[cd.CHANNEL_DEVICE].attributes.items()} == {
        "type": {"string": "channel"},
        "id": {"int": 0},
    }
    assert published[cd.DAEMON_DEVICE].attributes["type"].to_json() == {"string": "daemon"}
    fabric = node.backend.fabric
    assert fabric is not None
    assert fabric.clique_id == GB200_CLIQUE
    assert fabric.channel_major == IMEX_CHANNELS_MAJOR
    assert fabric.imex_mgmt is not None
    assert fabric.imex_mgmt.path.startswith("/dev/nvidia-caps/")


def test_an_h100_host_publishes_the_same_devices_with_no_clique(tmp_path: Path) -> None:
    node = DomainNode(tmp_path, profile="h100-80gb-x8")
    inventory = node.simulated.discover_sync()
    assert sorted(d.name for d in inventory.devices) == [cd.CHANNEL_DEVICE, cd.DAEMON_DEVICE]
    assert node.backend.fabric is not None
    assert node.backend.fabric.clique_id == ""
    assert node.backend.fabric.imex_mgmt is None


def test_with_host_managed_imex_no_daemon_device_is_published(tmp_path: Path) -> None:
    node = DomainNode(tmp_path, host_managed=True)
    assert [d.name for d in node.simulated.discover_sync().devices] == [cd.CHANNEL_DEVICE]


def _gpu(
    cluster: str, clique: int, state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
) -> fabric_info.GpuFabric:
    return fabric_info.GpuFabric(uuid="GPU-1", cluster_uuid=cluster, clique=clique, state=state, status=0)


def test_the_clique_id_is_the_gpus_agreed_cluster_and_clique() -> None:
    cluster = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b"
    assert fabric_info.clique_id([_gpu(cluster, 1), _gpu(cluster, 1)], strict=True) == f"{cluster}.1"
    assert fabric_info.clique_id([None, None], strict=True) == ""  # no fabric info
    with pytest.raises(fabric_info.FabricError, match="different NVLink cliques"):
        fabric_info.clique_id([_gpu(cluster, 1), _gpu(cluster, 2)], strict=True)
    pending = _gpu(cluster, 1, state=pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
    with pytest.raises(fabric_info.FabricError, match="IN_PROGRESS"):
        fabric_info.clique_id([pending], strict=True)
    assert fabric_info.clique_id([pending], strict=False) == ""


def test_the_driver_runs_only_when_compute_domains_are_on(tmp_path: Path) -> None:
    def kinds(on: bool) -> list[str]:
        config = DiscoveryConfig(
            node_name=NODE,
            simulated_profiles=("gb200-nvl-x4",),
            simulation_dir=str(tmp_path / f"sim-{on}"),
            compute_domains=on,
        )
        return [b.driver for b in simulated_record.backends(config)]

    assert kinds(False) == [GPU]  # the default install: the GPU driver only, as before
    assert kinds(True) == [GPU, cd.DRIVER]
    node = DomainNode(tmp_path)
    # Channels and daemons have no health and no data: their claims get no status.devices entries.
    assert prepare_tools.writes_device_status(node.simulated) is False


# -- channel claims ----------------------------------------------------------------------------------


async def test_a_channel_claim_labels_the_node_and_gets_channel_0_once_the_daemon_is_ready(
    tmp_path: Path,
) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    handler = await node.handler()
    ref = node.add_claim("channel", config=channel_config())
    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert node.api.labels[cd.DOMAIN_LABEL] == DOMAIN_UID
    spec = node.spec(ref)
    assert spec is not None
    nodes = [n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    assert nodes == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "type": "c",
            "major": IMEX_CHANNELS_MAJOR,
            "minor": 0,
            "fileMode": 0o666,
        }
    ]
    assert [d.device for d in result.devices] == [cd.CHANNEL_DEVICE]
    assert len(result.devices[0].cdi_device_ids) == 1

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert cd.DOMAIN_LABEL not in node.api.labels
    assert node.spec(ref) is None


async def test_allocation_mode_all_injects_every_channel(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    handler = await node.handler()
    ref = node.add_claim("all", config=channel_config(mode=cd.ALL))
    assert (await handler.prepare([ref]))[ref.uid].error == ""
    spec = node.spec(ref)
    assert spec is not None
    nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert len(nodes) == cd.MAX_IMEX_CHANNELS
    assert nodes[-1]["path"] == f"/dev/nvidia-caps-imex-channels/channel{cd.MAX_IMEX_CHANNELS - 1}"


async def test_without_nvlink_fabric_a_channel_is_prepared_with_no_device(tmp_path: Path) -> None:
    node = DomainNode(tmp_path, profile="h100-80gb-x8")
    domain = node.api.add_domain(DOMAIN_UID)
    # Without a clique the daemon's readiness is in the domain's status.
    ready = cd.DomainNode(name=NODE, ip_address="10.0.0.7", clique_id="", index=0, status=cd.READY)
    node.api.domains[DOMAIN_UID] = cd.ComputeDomain(**{**domain.__dict__, "nodes": (ready,)})
    handler = await node.handler()
    ref = node.add_claim("channel", config=channel_config())
    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert [d.cdi_device_ids for d in result.devices] == [()]
    assert node.spec(ref) is None
    assert node.api.labels[cd.DOMAIN_LABEL] == DOMAIN_UID  # the daemon still lands (and idles)


async def test_a_daemon_not_ready_in_time_gives_a_retryable_error_and_the_retry_succeeds(
    tmp_path: Path,
) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    handler = await node.handler(ready_budget_s=0.0)
    ref = node.add_claim("channel", config=channel_config())
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "is not ready" in error
    assert "not in clique" in error
    # The node stays labelled, so the daemon lands; the kubelet's next call finds it ready.
    assert node.api.labels[cd.DOMAIN_LABEL] == DOMAIN_UID
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE, status=cd.NOT_READY)
    assert "NotReady in clique" in (await handler.prepare([ref]))[ref.uid].error
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    assert (await handler.prepare([ref]))[ref.uid].error == ""


async def test_a_claim_of_another_namespace_cannot_join_a_domain(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID, namespace="victim")
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    handler = await node.handler()
    ref = node.add_claim("intruder", namespace="attacker", config=channel_config())
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "must be in its domain's namespace" in error
    assert node.api.labels == {}
    # The refused claim holds nothing: the domain's own claim prepares.
    own = node.add_claim("own", namespace="victim", config=channel_config())
    assert (await handler.prepare([own]))[own.uid].error == ""


async def test_a_node_serves_one_domain_at_a_time(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    node.api.add_domain(OTHER_UID)
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    handler = await node.handler()
    first = node.add_claim("first", config=channel_config())
    assert (await handler.prepare([first]))[first.uid].error == ""
    second = node.add_claim("second", config=channel_config(OTHER_UID))
    assert (await handler.prepare([second]))[second.uid].error != ""
    assert node.api.labels[cd.DOMAIN_LABEL] == DOMAIN_UID


async def test_the_domains_own_daemon_claim_neither_keeps_the_label_nor_holds_the_node(
    tmp_path: Path,
) -> None:
    """The domain's daemon claim is prepared on the node as long as its pod runs there, which is as
    long as the label stays: the last channel's unprepare must remove the label all the same, or the
    daemon, its DaemonSet and the domain would never go. A daemon claim of a domain the node is
    leaving does not keep another domain's channel out either."""
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    node.api.add_domain(OTHER_UID)
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    node.api.daemon_ready(OTHER_UID, GB200_CLIQUE)
    handler = await node.handler()
    channel = node.add_claim("channel", config=channel_config())
    assert (await handler.prepare([channel]))[channel.uid].error == ""
    daemon = node.add_claim("daemon", device=cd.DAEMON_DEVICE, namespace=DRIVER_NS, config=daemon_config())
    assert (await handler.prepare([daemon]))[daemon.uid].error == ""
    assert (await handler.unprepare([channel]))[channel.uid] == ""
    assert cd.DOMAIN_LABEL not in node.api.labels

    other = node.add_claim("other", config=channel_config(OTHER_UID))
    assert (await handler.prepare([other]))[other.uid].error == ""  # the old daemon still prepared
    assert node.api.labels[cd.DOMAIN_LABEL] == OTHER_UID


async def test_unprepare_leaves_a_label_of_another_domain_alone(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    node.api.daemon_ready(DOMAIN_UID, GB200_CLIQUE)
    handler = await node.handler()
    ref = node.add_claim("channel", config=channel_config())
    assert (await handler.prepare([ref]))[ref.uid].error == ""
    node.api.labels[cd.DOMAIN_LABEL] = OTHER_UID  # someone relabelled the node meanwhile
    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert node.api.labels[cd.DOMAIN_LABEL] == OTHER_UID


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, "domainID cannot be empty"),
        ({"apiVersion": NVIDIA, "kind": cd.CHANNEL_CONFIG_KIND, "domainID": "nope"}, "domainID"),
    ],
)
async def test_a_channel_without_a_valid_domain_config_is_refused(
    tmp_path: Path, config: dict[str, Any] | None, expected: str
) -> None:
    node = DomainNode(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("channel", config=config)
    assert expected in (await handler.prepare([ref]))[ref.uid].error
    assert node.api.labels == {}


async def test_missing_and_deleting_domains_are_refused(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("channel", config=channel_config())
    assert "no ComputeDomain has UID" in (await handler.prepare([ref]))[ref.uid].error
    node.api.add_domain(DOMAIN_UID, deleting=True)
    assert "being deleted" in (await handler.prepare([ref]))[ref.uid].error
    assert node.api.labels == {}


async def test_an_agent_without_compute_domains_refuses_channel_devices(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    handler = await node.handler(domains=False)
    ref = node.add_claim("channel", config=channel_config())
    assert "does not serve ComputeDomains" in (await handler.prepare([ref]))[ref.uid].error


# -- daemon claims -----------------------------------------------------------------------------------


async def test_a_daemon_claim_gets_its_domains_folder_identity_and_the_imex_capability(
    tmp_path: Path,
) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    handler = await node.handler()
    ref = node.add_claim("daemon", device=cd.DAEMON_DEVICE, namespace=DRIVER_NS, config=daemon_config())
    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == ""
    folder = node.plugins / cd.DRIVER / "domains" / DOMAIN_UID
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / imex_config.TEMPLATE_NAME).read_text() == imex_config.TEMPLATE_TEXT
    spec = node.spec(ref)
    assert spec is not None
    edits = spec["devices"][0]["containerEdits"]
    assert f"CLIQUE_ID={GB200_CLIQUE}" in edits["env"]
    assert f"COMPUTE_DOMAIN_UUID={DOMAIN_UID}" in edits["env"]
    assert f"COMPUTE_DOMAIN_NAMESPACE={TENANT}" in edits["env"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts[imex_config.FOLDER] == str(folder)
    assert "/usr/bin/nvidia-imex" in mounts
    assert "/usr/bin/nvidia-imex-ctl" in mounts
    assert any(n["path"].startswith("/dev/nvidia-caps/nvidia-cap") for n in edits["deviceNodes"])
    assert node.api.labels == {}  # a daemon claim labels nothing

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert not folder.exists()


async def test_a_daemon_claim_outside_the_drivers_namespace_is_refused(tmp_path: Path) -> None:
    node = DomainNode(tmp_path)
    node.api.add_domain(DOMAIN_UID)
    handler = await node.handler()
    ref = node.add_claim("daemon", device=cd.DAEMON_DEVICE, namespace=TENANT, config=daemon_config())
    assert "must be in the driver's namespace" in (await handler.prepare([ref]))[ref.uid].error
    assert not (node.plugins / cd.DRIVER / "domains" / DOMAIN_UID).exists()


# -- host-managed IMEX -------------------------------------------------------------------------------


async def test_with_host_managed_imex_a_channel_needs_the_hosts_daemon_ready(tmp_path: Path) -> None:
    node = DomainNode(tmp_path, host_managed=True)
    node.api.add_domain(DOMAIN_UID)
    handler = await node.handler()
    ref = node.add_claim("channel", config=channel_config(mode=cd.ALL))
    # The simulated nvidia-imex-ctl answers READY once the host daemon's socket exists.
    assert "host's IMEX daemon is not ready" in (await handler.prepare([ref]))[ref.uid].error
    assert node.host_socket is not None
    node.host_socket.write_text("")
    assert (await handler.prepare([ref]))[ref.uid].error == ""
    spec = node.spec(ref)
    assert spec is not None
    # Channel 0 only, whatever the mode asks (as NVIDIA's host-managed mode), and no label: no daemon.
    assert [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia-caps-imex-channels/channel0"
    ]
    assert node.api.labels == {}
