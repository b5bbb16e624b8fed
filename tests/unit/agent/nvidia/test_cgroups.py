"""The memory cgroups of the MPS daemons: which hierarchy a node has, and what is written where on
cgroup v2 (a fake tree: this machine class mounts v1, which the MPS tests use for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_node_agent.nvidia.cgroups import CgroupError, Hierarchy, MemoryCgroups, valid_parent


def v2_tree(root: Path, *, controllers: str = "cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("cpu\n")
    return root


def test_the_hierarchy_is_v2_with_memory_or_the_v1_memory_one_or_none(tmp_path: Path) -> None:
    assert Hierarchy.detect(v2_tree(tmp_path / "v2")) == Hierarchy(version=2, root=tmp_path / "v2")
    assert Hierarchy.detect(v2_tree(tmp_path / "v2-no-memory", controllers="cpu io")) is None
    (tmp_path / "v1" / "memory").mkdir(parents=True)
    (tmp_path / "v1" / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert Hierarchy.detect(tmp_path / "v1") == Hierarchy(version=1, root=tmp_path / "v1" / "memory")
    assert Hierarchy.detect(tmp_path / "nothing") is None


def test_on_v2_memory_is_delegated_down_to_the_claims_cgroup_and_limited_there(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg")
    # What the kernel would create in each new cgroup, made ahead in the fake tree.
    claim = root / "nodes" / "mps" / "claim-1"
    claim.mkdir(parents=True)
    for level in (root / "nodes", root / "nodes" / "mps"):
        (level / "cgroup.subtree_control").write_text("\n")
    for name in ("memory.max", "memory.swap.max", "memory.oom.group", "cgroup.procs"):
        (claim / name).write_text("")
    cgroups = MemoryCgroups(cgroup_root=root, parent="nodes/mps", memory_limit=64 << 20)

    assert cgroups.create("claim-1") == claim / "cgroup.procs"
    for level in (root, root / "nodes", root / "nodes" / "mps"):
        assert (level / "cgroup.subtree_control").read_text().startswith("+memory"), level
    assert (claim / "memory.max").read_text() == str(64 << 20)
    assert (claim / "memory.swap.max").read_text() == "0"
    assert (claim / "memory.oom.group").read_text() == "1"


def test_a_cgroup_that_cannot_be_made_says_which_and_why(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg")
    cgroups = MemoryCgroups(cgroup_root=root, parent="mps", memory_limit=1 << 30)
    # A real cgroup folder has its memory.max; a plain folder has none to write.
    with pytest.raises(CgroupError, match=r"setting up cgroup .*/cg/mps/claim-1: No such file"):
        cgroups.create("claim-1")
    none = MemoryCgroups(cgroup_root=tmp_path / "empty", parent="mps", memory_limit=1 << 30)
    with pytest.raises(CgroupError, match="set --cgroup-root"):
        none.create("claim-1")
    none.remove("claim-1")  # nothing to remove where nothing could be made
    assert none.oom_kills("claim-1") == 0


@pytest.mark.parametrize(
    ("parent", "valid"),
    [
        ("accel-dra-mps", True),
        ("system.slice/accel-dra-mps", True),
        ("", False),
        ("/abs", False),
        ("a/../b", False),
        ("..", False),
        ("a//b", False),
        ("a/b/", False),
        ("a b", False),
        (".hidden", False),
    ],
)
def test_a_cgroup_parent_is_a_relative_path_of_plain_names(parent: str, valid: bool) -> None:
    assert valid_parent(parent) is valid
