"""A VFIO group is what a container is handed whole: TPU chips that share one (no ACS isolation
between them) would give one claim the others' chips, so none of them is published (security
review L10). Chips in groups of their own on the same host still are."""

from __future__ import annotations

from pathlib import Path

import yaml

from dra_node_agent.simulated.discovery import SimulatedBackend


def _profile(tmp_path: Path, groups: list[int]) -> Path:
    path = tmp_path / "shared-groups.yaml"
    path.write_text(
        yaml.safe_dump({"tpu": {"generation": "v6e", "chips": len(groups), "iommuGroups": groups}})
    )
    return path


def test_chips_sharing_a_vfio_group_are_not_published(tmp_path: Path) -> None:
    backend = SimulatedBackend(
        profile=_profile(tmp_path, [3, 3, 5, 6]), node_name="n1", state_dir=tmp_path / "hw"
    )
    inventory = backend.discover_sync()
    nodes = [n.path for d in inventory.devices for n in d.edits.device_nodes]
    assert nodes == ["/dev/vfio/5", "/dev/vfio/6"], nodes
    (error,) = [e for e in inventory.errors if "share the VFIO group" in e]
    assert "TPU chips at 0000:00:04.0, 0000:00:05.0 share the VFIO group /dev/vfio/3" in error


def test_a_group_per_chip_publishes_every_chip(tmp_path: Path) -> None:
    backend = SimulatedBackend(profile=_profile(tmp_path, [3, 4]), node_name="n1", state_dir=tmp_path / "hw")
    inventory = backend.discover_sync()
    assert len(inventory.devices) == 2
    assert not [e for e in inventory.errors if "VFIO" in e]
