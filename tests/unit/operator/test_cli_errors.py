"""``dra-operator`` (run, release-claims, simulate) and ``kubectl-dra`` on bad input and on clusters
they cannot use: one line on stderr naming the problem, exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli_errors import closed_port, one_line_error, run_script, silent_port, write_kubeconfig


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--kubeconfig", "/nonexistent"], ["dra-operator run: kubeconfig /nonexistent: no such file"]),
        ([], ["no kubeconfig given", "not running in a pod", "KUBERNETES_SERVICE_HOST"]),
        (["--metrics-port", "70000"], ["metrics_port", "70000"]),
        (["--log-level", "LOUD"], ["log_level", "LOUD"]),
        (["--bogus"], ["unrecognized arguments: --bogus"]),
        (["--ownership", "some"], ["--ownership", "'some'"]),
        # Flags are checked before the kubeconfig.
        (["--metrics-port", "-1", "--kubeconfig", "/nonexistent"], ["metrics_port"]),
        (
            ["--feature-gates", "DRAPartitionableDevice=true", "--kubeconfig", "/nonexistent"],
            ["--feature-gates", "unknown feature gate 'DRAPartitionableDevice'"],
        ),
        (["--feature-gates", "DRAAdminAccess"], ["--feature-gates", "expected Name=true or Name=false"]),
    ],
    ids=[
        "no-kubeconfig-file",
        "not-in-a-pod",
        "port-range",
        "log-level",
        "unknown-flag",
        "ownership",
        "flags-first",
        "misspelt-gate",
        "gate-without-value",
    ],
)
def test_run_refuses_bad_input(tmp_path: Path, args: list[str], names: list[str]) -> None:
    result = run_script("dra-operator", "run", *args, home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, *names)


def test_run_reads_kubeconfig_from_the_environment(tmp_path: Path) -> None:
    result = run_script("dra-operator", "run", home=tmp_path, env={"KUBECONFIG": "/nonexistent"})
    assert result.returncode == 2
    one_line_error(result, "kubeconfig /nonexistent: no such file")


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("clusters: [\n", ["not valid YAML"]),
        ("- a list\n", ["not a kubeconfig"]),
        ("apiVersion: v1\nkind: Config\n", ["current-context"]),
    ],
    ids=["yaml", "not-a-mapping", "no-current-context"],
)
def test_run_refuses_a_malformed_kubeconfig(tmp_path: Path, content: str, names: list[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    result = run_script("dra-operator", "run", f"--kubeconfig={kubeconfig}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, f"kubeconfig {kubeconfig}", *names)


def test_run_says_the_api_server_refuses_connections(tmp_path: Path) -> None:
    with closed_port() as port:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{port}")
        result = run_script("dra-operator", "run", f"--kubeconfig={kubeconfig}", home=tmp_path)
    assert result.returncode == 2
    line = one_line_error(result, f"cannot reach the API server https://127.0.0.1:{port}")
    assert line.endswith("Connection refused")


def test_run_says_the_api_server_does_not_answer(tmp_path: Path) -> None:
    with silent_port() as port:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{port}")
        result = run_script(
            "dra-operator",
            "run",
            f"--kubeconfig={kubeconfig}",
            "--request-timeout-seconds=0.5",
            home=tmp_path,
        )
    assert result.returncode == 2
    one_line_error(result, f"the API server https://127.0.0.1:{port} did not answer within 0.5 s")


def test_release_claims_refuses_a_missing_kubeconfig(tmp_path: Path) -> None:
    result = run_script("dra-operator", "release-claims", "--kubeconfig=/nonexistent", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-operator release-claims: kubeconfig /nonexistent: no such file")


def test_release_claims_says_the_api_server_refuses_connections(tmp_path: Path) -> None:
    with closed_port() as port:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{port}")
        result = run_script("dra-operator", "release-claims", f"--kubeconfig={kubeconfig}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, f"cannot reach the API server https://127.0.0.1:{port}: Connection refused")


def test_simulate_refuses_a_missing_file(tmp_path: Path) -> None:
    result = run_script("dra-operator", "simulate", "-f", "/nonexistent", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "dra-operator simulate:", "/nonexistent")


def test_unknown_command(tmp_path: Path) -> None:
    result = run_script("dra-operator", "nosuch", home=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("dra-operator: unknown command 'nosuch'")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--kubeconfig", "/nonexistent"], ["error: stat /nonexistent: no such file or directory"]),
        ([], ["error: no configuration has been provided"]),
    ],
    ids=["no-kubeconfig-file", "no-kubeconfig"],
)
def test_kubectl_dra_refuses_a_missing_kubeconfig(tmp_path: Path, args: list[str], names: list[str]) -> None:
    result = run_script("kubectl-dra", "devices", *args, home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, *names)


def test_kubectl_dra_says_the_api_server_refuses_connections(tmp_path: Path) -> None:
    with closed_port() as port:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{port}")
        result = run_script("kubectl-dra", "claims", "-A", f"--kubeconfig={kubeconfig}", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "error: cannot reach the API server")
