"""Where a real node's folder goes: under the cluster's workdir only while every socket fits."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES, POD_UID_BYTES, path_bytes
from dra_api.names import GPU_DRIVER
from dra_devcluster.cluster import _node_root
from dra_devcluster.node import NodeLayout

# What an agent pod serving gpu.nvidia.com adds below the node folder: its registration socket
# named after its pod UID, the longest of all the node's sockets.
REGISTRATION_TAIL = f"/kubelet/plugins_registry/{GPU_DRIVER}-{'u' * POD_UID_BYTES}-reg.sock"


def _root_of_length(length: int) -> Path:
    return Path("/t" + "x" * (length - 2))


def test_the_longest_socket_is_an_agent_pods_registration_socket() -> None:
    layout = NodeLayout(Path("/tmp/n"))
    assert str(layout.longest_socket()) == "/tmp/n" + REGISTRATION_TAIL


def test_a_node_fits_up_to_the_last_byte_and_not_one_more() -> None:
    limit = MAX_SOCKET_PATH_BYTES - len(REGISTRATION_TAIL)
    assert NodeLayout(_root_of_length(limit)).fits()
    assert path_bytes(NodeLayout(_root_of_length(limit)).longest_socket()) == MAX_SOCKET_PATH_BYTES
    assert not NodeLayout(_root_of_length(limit + 1)).fits()


def test_the_first_pytest_run_of_a_new_machine_does_not_fit() -> None:
    # A new machine's first pytest folder, as the overlay test's node had it: its agent pod's DRA
    # socket was 125 bytes there, although the old fixed limit (48) let the 45-byte root through.
    assert not NodeLayout(Path("/tmp/pytest-of-root/pytest-0/cluster0/nodes/ov-1")).fits()


def test_a_short_root_stays_where_it_is() -> None:
    nodes = Path(tempfile.mkdtemp(prefix="n", dir="/tmp"))  # pytest's tmp_path is too long to fit
    try:
        assert _node_root(nodes / "a") == nodes / "a"
        assert not (nodes / "a").exists()
    finally:
        nodes.rmdir()


def test_a_long_root_moves_to_a_short_folder_linked_from_it(tmp_path: Path) -> None:
    nodes = tmp_path / ("long" * 20)
    nodes.mkdir()
    root = _node_root(nodes / "ov-1")
    try:
        assert root != nodes / "ov-1"
        assert (nodes / "ov-1").is_symlink()
        assert (nodes / "ov-1").resolve() == root.resolve()
        assert NodeLayout(root).fits()
    finally:
        (nodes / "ov-1").unlink()
        root.rmdir()


def test_agents_run_as_processes_leave_a_node_more_room() -> None:
    # The demo's workdir (/tmp/demo-<8>) and node name: its agents use the fixed socket names.
    root = Path("/tmp/demo-1y3125wk/nodes/gpu-node-1")
    assert not NodeLayout(root).fits()
    assert NodeLayout(root).fits(agent_pods=False)
    assert NodeLayout(root).longest_socket(agent_pods=False).name == f"{GPU_DRIVER}-reg.sock"
