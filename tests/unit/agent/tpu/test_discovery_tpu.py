"""TPU discovery over the fake host trees in tests/fixtures/sysfs (see make_sysfs_fixtures.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dra_node_agent.devices import check_inventory
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.tpu.discovery import TpuBackend, google_tpu_present, read_tpu_env

FIXTURES = Path(__file__).parents[3] / "fixtures" / "sysfs"


def backend(host: str, **kwargs: object) -> TpuBackend:
    root = FIXTURES / host
    return TpuBackend(
        node_name="tpu-node-1",
        sysfs_root=root / "sys",
        dev_root=root / "dev",
        tpu_env_path=root / "etc" / "tpu" / "tpu-env",
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("host", "gen", "accelerator", "chips", "topology", "memory", "cores", "first_node"),
    [
        ("tpu-v4-host", "v4", "tpu-v4-podslice", 4, "2x2x1", "32Gi", 2, "/dev/accel0"),
        ("tpu-v5e-host", "v5litepod", "tpu-v5-lite-podslice", 8, "2x4", "16Gi", 1, "/dev/vfio/10"),
        ("tpu-v5p-host", "v5p", "tpu-v5p-slice", 4, "2x2x4", "95Gi", 2, "/dev/vfio/0"),
        ("tpu-v6e-host", "v6e", "tpu-v6e-slice", 8, "2x4", "32Gi", 1, "/dev/vfio/0"),
        ("tpu7x-host", "tpu7x", "tpu7x", 4, "2x2x1", "192Gi", 2, "/dev/vfio/0"),
    ],
)
async def test_tpu_hosts(
    host: str, gen: str, accelerator: str, chips: int, topology: str, memory: str, cores: int, first_node: str
) -> None:
    inventory = await backend(host).discover()

    assert inventory.driver == "tpu.google.com"
    # Named as Google's driver names them: by device file, accelN or the VFIO group number.
    assert [d.name for d in inventory.devices] == [d.local_id for d in inventory.devices]
    assert inventory.devices[0].name == first_node.rsplit("/", 1)[1]
    assert len(inventory.devices) == chips
    assert check_inventory(inventory) == []
    first = inventory.devices[0].to_slice_device()
    attrs = first["attributes"]
    assert attrs["tpuGen"] == {"string": gen}
    assert attrs["accelerator"] == {"string": accelerator}
    assert attrs["chipCount"] == {"int": chips}
    assert attrs["topology"] == {"string": topology}
    assert attrs["brand"] == {"string": "Google"}
    assert attrs["type"] == {"string": "tpu"}
    assert attrs["index"] == {"int": 0}
    assert attrs["tensorCores"] == {"int": cores}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert attrs["uuid"]["string"].startswith("tpu-")
    assert first["capacity"] == {"memory": {"value": memory}}
    assert inventory.devices[0].edits.device_nodes[0].path == first_node
    assert inventory.tpu_host is not None
    assert inventory.tpu_host.topology == topology
    # gVNIC and NVMe share Google's vendor ID but are not chips.
    assert all(d.pci_bus_id not in ("0000:00:02.0", "0000:00:03.0") for d in inventory.devices)


async def test_vfio_hosts_add_the_vfio_container_node() -> None:
    vfio = await backend("tpu-v6e-host").discover()
    accel = await backend("tpu-v4-host").discover()
    assert [n.path for n in vfio.common_edits.device_nodes] == ["/dev/vfio/vfio"]
    assert accel.common_edits.device_nodes == ()
    assert [d.local_id for d in accel.devices] == ["accel0", "accel1", "accel2", "accel3"]


async def test_tpu7x_groups_two_functions_per_chip() -> None:
    inventory = await backend("tpu7x-host").discover()
    assert [n.path for n in inventory.devices[1].edits.device_nodes] == ["/dev/vfio/2", "/dev/vfio/3"]


async def test_tpu_env_file_sets_topology_and_worker_of_a_multi_host_slice() -> None:
    inventory = await backend("tpu-v5p-host").discover()
    host = inventory.tpu_host
    assert host is not None
    assert host.topology == "2x2x4"
    assert host.worker_id == 1
    assert host.slice_chips == 16
    assert not host.single_host


async def test_configured_topology_wins_over_the_tpu_env_file() -> None:
    inventory = await backend("tpu-v5p-host", topology="4x4x4").discover()
    assert inventory.tpu_host is not None
    assert inventory.tpu_host.topology == "4x4x4"


async def test_mixed_generations_publish_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        inventory = await backend("tpu-mixed-host").discover()
    assert inventory.devices == ()
    assert "mixed generations" in inventory.errors[0]
    assert "0x0063" in caplog.text
    assert "0x006f" in caplog.text


async def test_chip_without_device_node_is_skipped() -> None:
    inventory = await backend("tpu-missing-dev-host").discover()
    assert [d.pci_bus_id for d in inventory.devices] == ["0000:00:04.0", "0000:00:05.0", "0000:00:07.0"]
    assert "0000:00:06.0" in inventory.errors[0]
    assert inventory.tpu_host is not None
    assert inventory.tpu_host.chips_on_host == 3


def test_tpu_presence_ignores_other_google_devices() -> None:
    assert not google_tpu_present(FIXTURES / "no-tpu-host" / "sys")
    assert google_tpu_present(FIXTURES / "tpu-v5e-host" / "sys")
    assert not google_tpu_present(FIXTURES / "does-not-exist")


async def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    a1 = await backend("tpu-v6e-host").discover()
    a2 = await backend("tpu-v6e-host").discover()
    root = FIXTURES / "tpu-v6e-host"
    b = await TpuBackend(node_name="tpu-node-2", sysfs_root=root / "sys", dev_root=root / "dev").discover()
    assert [d.uuid for d in a1.devices] == [d.uuid for d in a2.devices]
    assert {d.uuid for d in a1.devices}.isdisjoint({d.uuid for d in b.devices})
    assert [d.name for d in a1.devices] == [d.name for d in b.devices]


async def test_simulated_v6e_profile_publishes_what_the_real_host_does(tmp_path: Path) -> None:
    real = await backend("tpu-v6e-host").discover()
    simulated = await SimulatedBackend(
        profile="tpu-v6e-2x4", node_name="tpu-node-1", state_dir=tmp_path
    ).discover()
    assert simulated.slice_devices() == real.slice_devices()
    assert simulated.tpu_host == real.tpu_host
    assert simulated.simulated
    assert not real.simulated


def test_tpu_env_parsing(tmp_path: Path) -> None:
    path = tmp_path / "tpu-env"
    path.write_text("TOPOLOGY: '4x4'\nWORKER_ID: \"3\"\nnot a line\n")
    assert read_tpu_env(path) == {"TOPOLOGY": "4x4", "WORKER_ID": "3"}
    assert read_tpu_env(tmp_path / "missing") == {}


def test_bad_topology_is_rejected() -> None:
    with pytest.raises(ValueError, match="TPU topology '2x'"):
        TpuBackend(node_name="n", topology="2x")


@pytest.mark.parametrize(
    ("profile", "worker", "hosts", "bounds"),
    [("tpu-v5p-2x2x4", 3, 4, (1, 1, 4)), ("tpu-v6e-4x4", 1, 2, (2, 1, 1))],
)
async def test_a_host_of_a_multi_host_slice_publishes_its_slice_and_worker_from_tpu_env(
    tmp_path: Path, profile: str, worker: int, hosts: int, bounds: tuple[int, int, int]
) -> None:
    env = tmp_path / "tpu-env"
    env.write_text(f"WORKER_ID: '{worker}'\nSLICE_ID: 'pool-a'\n")
    inventory = await SimulatedBackend(
        profile=profile, node_name="n", state_dir=tmp_path / "hw", tpu_env_path=env
    ).discover()
    assert check_inventory(inventory) == []
    host = inventory.tpu_host
    assert host is not None
    assert (host.slice_id, host.worker_id, host.slice_hosts, host.host_bounds) == (
        "pool-a",
        worker,
        hosts,
        bounds,
    )
    assert not host.single_host
    for device in inventory.slice_devices():
        assert device["attributes"]["sliceId"] == {"string": "pool-a"}
        assert device["attributes"]["workerId"] == {"int": worker}


async def test_without_a_tpu_env_file_no_slice_attributes_are_published(tmp_path: Path) -> None:
    inventory = await SimulatedBackend(profile="tpu-v5p-2x2x4", node_name="n", state_dir=tmp_path).discover()
    attributes = inventory.slice_devices()[0]["attributes"]
    assert "sliceId" not in attributes
    assert "workerId" not in attributes
    assert inventory.tpu_host is not None
    assert inventory.tpu_host.slice_hosts == 4


async def test_the_slice_identity_falls_back_to_node_id_and_refuses_what_is_no_attribute(
    tmp_path: Path,
) -> None:
    env = tmp_path / "tpu-env"
    env.write_text("WORKER_ID: '0'\nNODE_ID: 'my-tpu'\n")
    found = await SimulatedBackend(
        profile="tpu-v5p-2x2x4", node_name="n", state_dir=tmp_path / "a", tpu_env_path=env
    ).discover()
    assert found.slice_devices()[0]["attributes"]["sliceId"] == {"string": "my-tpu"}
    env.write_text("WORKER_ID: '0'\nSLICE_ID: '" + "x" * 65 + "'\n")
    refused = await SimulatedBackend(
        profile="tpu-v5p-2x2x4", node_name="n", state_dir=tmp_path / "b", tpu_env_path=env
    ).discover()
    assert "sliceId" not in refused.slice_devices()[0]["attributes"]
    assert "sliceId is not published" in refused.errors[0]
    assert check_inventory(refused) == []
