"""``dra-operator simulate``: good and bad inputs through main(argv), and the installed command."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_operator.entry import cli, simulate

FIXTURES = Path(__file__).parent / "fixtures"
CLUSTER = str(FIXTURES / "cluster.yaml")


def fx(name: str) -> str:
    return str(FIXTURES / name)


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str = "") -> tuple[int, str, str]:
    code = simulate.main(list(argv), stdin=io.StringIO(stdin))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def devices(result: dict[str, Any], i: int = 0) -> list[str]:
    allocation = result["claims"][i]["allocation"]
    return [f"{r['pool']}/{r['device']}" for r in allocation["devices"]["results"]]


@pytest.mark.parametrize(
    ("files", "flags", "code", "node", "expected"),
    [
        (["claim-one.yaml"], [], 0, "node-a", ["node-a/gpu-0"]),
        (["claim-one.yaml"], ["--policy", "spread"], 0, "node-a", ["node-a/gpu-0"]),
        (["claim-a100.yaml"], [], 0, "node-b", ["node-b/gpu-0", "node-b/gpu-1"]),
        (["claim-pair-same-root.yaml"], [], 0, "node-a", ["node-a/gpu-0", "node-a/gpu-1"]),
        # the List holds node-a's first PCIe root, so the pair comes from the second one
        (
            ["allocated-node-a.yaml", "claim-pair-same-root.yaml"],
            [],
            0,
            "node-a",
            ["node-a/gpu-2", "node-a/gpu-3"],
        ),
        (["claim-one.yaml"], ["--node", "node-b"], 0, "node-b", ["node-b/gpu-0"]),
        (["claim-memory.yaml"], [], 0, "node-a", ["node-a/gpu-0", "node-a/gpu-1", "node-a/gpu-2"]),
        (["claim-too-many.yaml"], [], 1, None, None),
        (["claim-pair-same-root.yaml"], ["--node", "node-b"], 1, None, None),
        (["allocated-node-a.yaml", "claim-memory.yaml"], [], 1, None, None),
        (["claim-one.yaml"], ["--node", "node-z"], 1, None, None),
    ],
)
def test_good_inputs(
    capsys: pytest.CaptureFixture[str],
    files: list[str],
    flags: list[str],
    code: int,
    node: str | None,
    expected: list[str] | None,
) -> None:
    argv = ["-f", CLUSTER, *(a for f in files for a in ("-f", fx(f))), *flags, "-o", "json"]
    got, out, err = run(capsys, *argv)
    assert (got, err) == (code, "")
    result = json.loads(out)
    assert set(result) == {"outcome", "node", "claims", "explanation", "error"}
    assert result["error"] is None
    if code == 0:
        assert result["outcome"] == "allocated"
        assert result["node"] == node
        assert devices(result) == expected
        selector = result["claims"][0]["allocation"]["nodeSelector"]
        assert selector["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    else:
        assert result["outcome"] == "unallocatable"
        assert result["node"] is None
        assert result["claims"][0]["allocation"] is None
        assert "cannot be allocated" in result["explanation"]
        assert "needs" in result["explanation"]


def test_pending_claims_are_allocated_together_in_input_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "-f", CLUSTER, "-f", fx("claim-one.yaml"), "-f", fx("claim-a100.yaml"), "-o", "json"
    )
    assert code == 0
    result = json.loads(out)
    # a100 needs node-b, so both go there: one node for the pod's claims
    assert result["node"] == "node-b"
    assert [(c["namespace"], c["name"]) for c in result["claims"]] == [("default", "one"), ("team", "a100")]
    assert devices(result, 0) == ["node-b/gpu-0"]
    assert devices(result, 1) == ["node-b/gpu-1", "node-b/gpu-2"]


def test_unallocatable_explanation_names_counts_and_constraint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-f", CLUSTER, "-f", fx("claim-pair-same-root.yaml"), "--node", "node-b")
    assert code == 1
    assert "claim default/pair cannot be allocated on node node-b" in out
    assert (
        "request gpus wants 2 devices sharing one value under constraint (matchAttribute "
        "resource.kubernetes.io/pcieRoot on gpus); no value has that many that can serve it together"
    ) in out
    assert "to change: relax constraint" in out


def test_table_and_yaml_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-f", CLUSTER, "-f", fx("claim-a100.yaml"), "-o", "table")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE", "NODE"]
    assert lines[1].split() == ["team/a100", "gpu", "gpu.nvidia.com", "node-b", "gpu-0", "node-b"]
    assert lines[2].split() == ["team/a100", "gpu", "gpu.nvidia.com", "node-b", "gpu-1", "node-b"]
    assert "allocated 1 claim on node node-b" in out
    code, out, _ = run(capsys, "-f", CLUSTER, "-f", fx("claim-a100.yaml"), "-o", "yaml")
    result = yaml.safe_load(out)
    assert result["outcome"] == "allocated"
    assert devices(result) == ["node-b/gpu-0", "node-b/gpu-1"]


def test_stdin_json_and_list_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((FIXTURES / "cluster.yaml").read_text()))
    as_list = {"apiVersion": "v1", "kind": "List", "items": docs}
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(as_list))
    claim_text = (FIXTURES / "claim-one.yaml").read_text()
    code, out, err = run(capsys, "-f", str(cluster), "-f", "-", "-o", "json", stdin=claim_text)
    assert (code, err) == (0, "")
    assert devices(json.loads(out)) == ["node-a/gpu-0"]


def test_typed_list_items_without_kind(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((FIXTURES / "cluster.yaml").read_text()))
    slices = [{k: v for k, v in d.items() if k != "kind"} for d in docs if d["kind"] == "ResourceSlice"]
    others = [d for d in docs if d["kind"] != "ResourceSlice"]
    path = tmp_path / "in.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [*others, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "items": slices}]
        )
    )
    code, out, _ = run(capsys, "-f", str(path), "-f", fx("claim-a100.yaml"), "-o", "json")
    assert code == 0
    assert json.loads(out)["node"] == "node-b"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["-f", CLUSTER, "-f", fx("claim-bad-cel.yaml")],
            "claim-bad-cel.yaml: ResourceClaim default/badcel: "
            "spec.devices.requests[0].exactly.selectors[0].cel.expression: CEL compile error",
        ),
        (
            ["-f", CLUSTER, "-f", fx("claim-missing-class.yaml")],
            "claim-missing-class.yaml: ResourceClaim default/noclass: "
            "spec.devices.requests[0].exactly.deviceClassName: DeviceClass 'tpu.google.com' not found",
        ),
        (
            ["-f", CLUSTER, "-f", fx("claim-misplaced-field.yaml")],
            "claim-misplaced-field.yaml: ResourceClaim default/misplaced: spec.devices.requests[0]."
            "deviceClassName is a v1beta1 field; in resource.k8s.io/v1 it belongs under exactly",
        ),
        (
            ["-f", CLUSTER, "-f", fx("unknown-kind.yaml")],
            "unknown-kind.yaml: document 1: unsupported kind 'Pod'",
        ),
        (["-f", CLUSTER, "-f", fx("broken.yaml")], "broken.yaml: invalid YAML at line 4, column 7"),
        (["-f", CLUSTER, "-f", fx("no-such-file.yaml")], "no-such-file.yaml: cannot read: No such file"),
        (["-f", CLUSTER], "no pending ResourceClaim"),
        (
            ["-f", CLUSTER, "-f", fx("claim-one.yaml"), "--feature-gates", "DRANoSuchGate=true"],
            "--feature-gates: unknown feature gate 'DRANoSuchGate'",
        ),
        (["-f", CLUSTER, "-f", fx("claim-one.yaml"), "--policy", "random"], "invalid choice: 'random'"),
        ([], "the following arguments are required: -f/--filename"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("dra-operator simulate: ")
    assert expected in err
    assert "Traceback" not in err


def test_invalid_class_selector_names_the_class_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = (
        (FIXTURES / "cluster.yaml")
        .read_text()
        .replace('device.driver == "gpu.nvidia.com"', "device.driver == ")
    )
    path = tmp_path / "bad-class.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "-f", str(path), "-f", fx("claim-one.yaml"))
    assert code == 2
    assert f"{path}: DeviceClass gpu.nvidia.com: spec.selectors[0].cel.expression: CEL compile error" in err


def test_cel_runtime_error_is_an_error_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "-f", CLUSTER, "-f", fx("claim-runtime-error.yaml"), "-o", "json")
    assert code == 2
    result = json.loads(out)
    assert result["outcome"] == "error"
    assert "CEL runtime error" in result["error"]
    assert "noSuchAttribute" in result["error"]
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_dispatches_to_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", "-f", CLUSTER, "-f", fx("claim-one.yaml"), "-o", "json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["node"] == "node-a"


def _console_script() -> str:
    script = Path(sys.executable).parent / "dra-operator"
    assert script.exists(), f"console script not installed next to {sys.executable}"
    return str(script)


def test_installed_command_allocates_and_explains() -> None:
    ok = subprocess.run(
        [_console_script(), "simulate", "-f", CLUSTER, "-f", fx("claim-pair-same-root.yaml"), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert devices(json.loads(ok.stdout)) == ["node-a/gpu-0", "node-a/gpu-1"]
    short = subprocess.run(
        [_console_script(), "simulate", "-f", CLUSTER, "-f", fx("claim-too-many.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert short.returncode == 1
    assert "needs 6" in short.stdout


def test_installed_command_bad_input_has_no_traceback() -> None:
    proc = subprocess.run(
        [_console_script(), "simulate", "-f", "-"],
        input="kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: x}\nspec: 3\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("dra-operator simulate: <stdin>: ResourceClaim")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("node", "code"), [("node-a", 0), ("node-b", 1), (None, 0)])
def test_node_labels_come_from_node_objects(
    capsys: pytest.CaptureFixture[str], node: str | None, code: int
) -> None:
    argv = ["-f", CLUSTER, "-f", fx("zone-a-slice.yaml"), "-f", fx("claim-five.yaml"), "-o", "json"]
    got, out, _ = run(capsys, *argv, *(["--node", node] if node else []))
    assert got == code
    result = json.loads(out)
    if code == 0:
        # node-a's four GPUs plus the zone-a GPU its label reaches
        assert result["node"] == "node-a"
        assert sorted(devices(result)) == [f"node-a/gpu-{i}" for i in range(4)] + ["zone-a/gpu-z"]
    else:
        assert "cannot be allocated on node node-b" in result["explanation"]


def test_a_node_without_a_node_object_has_no_labels(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    docs = [d for d in yaml.safe_load_all((FIXTURES / "cluster.yaml").read_text()) if d["kind"] != "Node"]
    path = tmp_path / "no-nodes.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out, _ = run(capsys, "-f", str(path), "-f", fx("zone-a-slice.yaml"), "-f", fx("claim-five.yaml"))
    assert code == 1
    assert "cannot be allocated on any of 2 nodes" in out


_GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
}
_CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
}


def _slice(
    name: str, pool: str, devices: list[dict[str, Any]], counters: tuple[str, ...] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "nodeName": pool,
        "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    if counters:
        spec["sharedCounters"] = [{"name": n, "counters": {"memory": {"value": "8"}}} for n in counters]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def _consumes(device: str, counter_set: str, counter: str = "memory") -> dict[str, Any]:
    return {
        "name": device,
        "consumesCounters": [{"counterSet": counter_set, "counters": {counter: {"value": "1"}}}],
    }


@pytest.mark.parametrize(
    ("slices", "reason"),
    [
        ([_slice("s", "n1", [{"name": "gpu-0"}, {"name": "gpu-0"}])], "duplicate device name 'gpu-0'"),
        (
            [_slice("s", "n1", [{"name": "gpu-0"}], counters=("gpu-0-set", "gpu-0-set"))],
            "duplicate counter set name 'gpu-0-set'",
        ),
        (
            [_slice("s", "n1", [_consumes("gpu-0", "nowhere")], counters=("gpu-0-set",))],
            "device 'gpu-0' consumes unknown counter set 'nowhere'",
        ),
        (
            [_slice("s", "n1", [_consumes("gpu-0", "gpu-0-set", "cores")], counters=("gpu-0-set",))],
            "device 'gpu-0' consumes unknown counter 'cores' of counter set 'gpu-0-set'",
        ),
        (
            # The counter set exists, but in another node's pool.
            [
                _slice("s", "n1", [_consumes("gpu-0", "n2-set")]),
                _slice("t", "n2", [{"name": "gpu-9"}], counters=("n2-set",)),
            ],
            "device 'gpu-0' consumes unknown counter set 'n2-set'",
        ),
    ],
    ids=[
        "duplicate-device",
        "duplicate-counter-set",
        "unknown-counter-set",
        "unknown-counter",
        "other-pools-set",
    ],
)
def test_an_invalid_pool_is_an_error_naming_the_pool_and_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, slices: list[dict[str, Any]], reason: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([_GPU_CLASS, *slices, _CLAIM]))
    code, out, err = run(capsys, "-f", str(path), "--node", "n1", "-o", "json")
    assert code == 2, (out, err)
    result = json.loads(out)
    assert result["outcome"] == "error"
    assert result["error"] == f"invalid ResourceSlice pools: gpu.nvidia.com/n1 ({reason}) on node n1"
    # The explanation is kept: it says the same, with what the node had.
    assert f"gpu.nvidia.com/n1 ({reason})" in result["explanation"]
    assert err.strip() == f"dra-operator simulate: {result['error']}"
