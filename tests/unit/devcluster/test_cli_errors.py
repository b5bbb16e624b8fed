"""``dra-local-cluster`` on bad arguments and missing prerequisites: one line on stderr starting
``dra-local-cluster:``, exit status 2, never a traceback; a bad argument starts nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import cli, productimage
from dra_devcluster.binaries import BinariesUnavailable, NodeUnavailable
from dra_devcluster.cluster import ControlPlaneError, PortTaken
from dra_devcluster.images import ImageUnavailable
from dra_devcluster.node import NodeStartError
from dra_devcluster.versions import VERSION_ENV
from tests.unit.cli_errors import one_line_error, run_script


def test_up_refuses_a_negative_node_count_and_starts_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    result = run_script("dra-local-cluster", "up", "--nodes", "-1", f"--workdir={workdir}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-local-cluster: argument --nodes: must be 0 or more, not -1")
    assert not workdir.exists()


def test_up_refuses_a_node_count_that_is_no_number(tmp_path: Path) -> None:
    result = run_script("dra-local-cluster", "up", "--nodes=many", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "--nodes", "'many'")


@pytest.mark.parametrize("command", ["up", "demo"])
def test_refuses_a_workdir_it_cannot_create(tmp_path: Path, command: str) -> None:
    result = run_script("dra-local-cluster", command, "--workdir=/proc/x", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-local-cluster: --workdir /proc/x: cannot create or write to it")


def test_refuses_a_workdir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = run_script("dra-local-cluster", "demo", f"--workdir={tmp_path / 'a-file' / 'x'}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "--workdir", "Not a directory")


def test_image_refuses_an_out_folder_it_cannot_create(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = run_script("dra-local-cluster", "image", f"--out={tmp_path / 'a-file' / 'dist'}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "--out", "Not a directory")


def test_unknown_command(tmp_path: Path) -> None:
    result = run_script("dra-local-cluster", "nosuch", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-local-cluster: argument command: invalid choice: 'nosuch'")


def test_an_unsupported_kubernetes_version_is_refused_before_anything_starts(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    result = run_script("dra-local-cluster", "up", "--kubernetes=1.33", f"--workdir={workdir}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-local-cluster: argument --kubernetes: '1.33' is not a supported", "v1.37.2")
    assert not workdir.exists()


@pytest.mark.parametrize("command", ["build", "up", "demo"])
def test_an_unsupported_version_in_the_environment_is_one_line(tmp_path: Path, command: str) -> None:
    workdir = tmp_path / "cluster"
    args = [] if command == "build" else [f"--workdir={workdir}"]
    env = {VERSION_ENV: "1.30"}
    result = run_script("dra-local-cluster", command, *args, home=tmp_path, env=env)
    assert result.returncode == 2
    one_line_error(result, f"dra-local-cluster: {VERSION_ENV}='1.30' is not a supported", "v1.34.12")
    assert not workdir.exists()


def test_up_runs_the_version_asked_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: dict[str, Any] = {}

    def cluster(**kwargs: Any) -> FakeCluster:
        asked.update(kwargs)
        return FakeCluster(enter=ControlPlaneError("stop here"))

    monkeypatch.setenv(VERSION_ENV, "1.35")
    monkeypatch.setattr(cli, "LocalCluster", cluster)
    assert cli.main(["up", "--kubernetes", "v1.34.x", f"--workdir={tmp_path}"]) == 2
    assert asked["kubernetes"].version == "v1.34.12"  # the flag wins over the environment
    assert cli.main(["up", f"--workdir={tmp_path}"]) == 2
    assert asked["kubernetes"].version == "v1.35.8"


def test_build_without_go_says_what_to_install(tmp_path: Path) -> None:
    """A real missing prerequisite: no binaries cached and no Go to build them with."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "DRA_CONTROL_PLANE_CACHE": str(tmp_path / "cache")}
    result = run_script("dra-local-cluster", "build", home=tmp_path, env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    # Above it, the log line saying what it was about to build.
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dra-local-cluster: cannot provide control-plane binaries"), result.stderr
    assert "no `go` on PATH" in last
    assert "install a Go toolchain" in last


# ---- every known error type, raised where the commands meet it -------------------------------------


class FakeCluster:
    """Stands in for LocalCluster: ``enter`` or ``node`` is raised where the real one would."""

    def __init__(self, *, enter: Exception | None = None, node: Exception | None = None) -> None:
        self.enter, self.node = enter, node

    def __call__(self, **_: Any) -> FakeCluster:
        return self

    def __enter__(self) -> FakeCluster:
        if self.enter is not None:
            raise self.enter
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def add_real_node(self, name: str) -> None:
        assert self.node is not None
        raise self.node


@pytest.fixture(autouse=True)
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # `up` takes SIGINT and SIGTERM over for its children; not in the test process.
    monkeypatch.setattr(cli, "_stop_on_signals", lambda: None)


TAIL = "E0101 etcd: bind: address already in use\nF0101 giving up"


@pytest.mark.parametrize(
    ("cluster", "first", "detail"),
    [
        (
            FakeCluster(enter=PortTaken(f"etcd exited with code 1 during start-up; last log lines:\n{TAIL}")),
            "dra-local-cluster: etcd exited with code 1 during start-up; last log lines:",
            ["  E0101 etcd: bind: address already in use", "  F0101 giving up"],
        ),
        (
            FakeCluster(enter=ControlPlaneError("kube-apiserver did not become ready")),
            "dra-local-cluster: kube-apiserver did not become ready",
            [],
        ),
        (
            FakeCluster(
                node=NodeUnavailable("a real node needs the Debian packages runc: apt-get install -y runc")
            ),
            "dra-local-cluster: a real node needs the Debian packages runc: apt-get install -y runc; "
            "a machine that cannot run a kubelet can still run the control plane with Node objects that "
            "have none: dra-local-cluster up --fake-nodes",
            [],
        ),
        (
            FakeCluster(
                node=NodeStartError("node node-1: kubelet did not start: exited\n--- last lines:\nboom")
            ),
            "dra-local-cluster: node node-1: kubelet did not start: exited; a machine that cannot run",
            ["  --- last lines:", "  boom"],
        ),
        (
            FakeCluster(
                node=ImageUnavailable("building the local images needs a static busybox: apt-get install")
            ),
            "dra-local-cluster: building the local images needs a static busybox: apt-get install",
            [],
        ),
    ],
    ids=["port-taken", "control-plane", "node-unavailable", "node-start", "image-unavailable"],
)
def test_up_turns_known_errors_into_a_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    cluster: FakeCluster,
    first: str,
    detail: list[str],
) -> None:
    monkeypatch.setattr(cli, "LocalCluster", cluster)
    assert cli.main(["up", f"--workdir={tmp_path}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(first), lines
    assert lines[1:] == detail


def test_build_turns_missing_binaries_into_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable(**_: object) -> None:
        raise BinariesUnavailable("cannot provide control-plane binaries etcd: no `go` on PATH. Install Go.")

    monkeypatch.setattr(cli, "ensure_binaries", unavailable)
    assert cli.main(["build"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "dra-local-cluster: cannot provide control-plane binaries etcd: no `go` on PATH. Install Go.\n"
    )


def test_image_turns_a_failed_step_into_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failed(**_: object) -> None:
        raise productimage.ImageBuildError("mmdebstrap failed (exit 1):\nE: no network")

    monkeypatch.setattr(productimage, "ensure_product_image", failed)
    assert cli.main(["image"]) == 2
    err = capsys.readouterr().err
    assert err == "dra-local-cluster: building the image: mmdebstrap failed (exit 1):\n  E: no network\n"
