"""``dra-node-agent`` on bad input: checked before any cluster login, one line on stderr naming the
problem, exit status 2, never a traceback. An API server that does not answer is waited for."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.unit.cli_errors import (
    SCRIPT_TIMEOUT_S,
    clean_env,
    closed_port,
    console_script,
    one_line_error,
    run_script,
    write_kubeconfig,
)


def folders(root: Path) -> list[str]:
    """Writable folders for everything the agent writes, so no check reaches /var/lib."""
    return [
        f"--state-dir={root / 'state'}",
        f"--cdi-dir={root / 'cdi'}",
        f"--kubelet-plugins-dir={root / 'plugins'}",
        f"--kubelet-registry-dir={root / 'registry'}",
    ]


def run_agent(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_script("dra-node-agent", "run", *folders(home), "--metrics-address=", *args, home=home)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (
            ["--node-name=x", "--kubeconfig=/nonexistent"],
            ["dra-node-agent: kubeconfig /nonexistent: no such file"],
        ),
        (["--node-name=x"], ["no kubeconfig given", "not running in a pod", "KUBERNETES_SERVICE_HOST"]),
        # The profile is checked before the (missing) cluster configuration.
        (["--node-name=x", "--simulate-profile=nosuch"], ["simulate_profile", "'nosuch'", "not shipped"]),
        (
            ["--node-name=x", "--simulate-profile=/nonexistent.yaml"],
            ["simulate_profile", "/nonexistent.yaml"],
        ),
        (
            ["--node-name=x", "--simulate-profile=h100-80gb-x8,a100-40gb-mig"],
            ["simulate_profile", "two profiles publish for driver"],
        ),
        ([], ["node_name is empty"]),
        (["--node-name=x", "--metrics-address=nonsense"], ["metrics_address", "'nonsense'"]),
        (["--node-name=x", "--metrics-address=:99999"], ["metrics_address", "99999"]),
        (["--node-name=x", "--claim-read-attempts=0"], ["claim_read_attempts"]),
        (["--node-name=x", "--bogus"], ["unrecognized arguments: --bogus"]),
    ],
    ids=[
        "no-kubeconfig-file",
        "not-in-a-pod",
        "unknown-profile",
        "missing-profile-file",
        "two-profiles-one-driver",
        "no-node-name",
        "metrics-address",
        "metrics-port-range",
        "claim-read-attempts",
        "unknown-flag",
    ],
)
def test_refuses_bad_input(tmp_path: Path, args: list[str], names: list[str]) -> None:
    result = run_agent(tmp_path, *args)
    assert result.returncode == 2
    one_line_error(result, *names)


def test_refuses_a_folder_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_agent(tmp_path, "--node-name=x", f"--state-dir={blocker / 'state'}")
    assert result.returncode == 2
    one_line_error(result, "setting state_dir", f"{blocker} is not a folder")


def test_refuses_a_malformed_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    result = run_agent(tmp_path, "--node-name=x", f"--kubeconfig={kubeconfig}")
    assert result.returncode == 2
    one_line_error(result, f"kubeconfig {kubeconfig}: not valid YAML")


def test_flags_without_the_run_command_are_checked_too(tmp_path: Path) -> None:
    result = run_script("dra-node-agent", "--node-name=x", "--kubeconfig=/nonexistent", home=tmp_path)
    assert result.returncode == 2
    one_line_error(result, "kubeconfig /nonexistent: no such file")


def test_says_it_cannot_listen_on_the_metrics_address(tmp_path: Path) -> None:
    with closed_port() as api_port, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{api_port}")
        result = run_agent(
            tmp_path, "--node-name=x", f"--kubeconfig={kubeconfig}", f"--metrics-address={address}"
        )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # The start-up log line comes first: the port is only found taken when the agent binds it.
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last == f"dra-node-agent: setting metrics_address: cannot listen on {address}: Address already in use"
    )


def test_waits_for_an_api_server_that_refuses_connections(tmp_path: Path) -> None:
    """A daemon: an agent (re)started while the API server is down keeps trying, one warning line
    per attempt, and SIGTERM still stops it cleanly."""
    with closed_port() as port:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{port}")
        argv = [
            console_script("dra-node-agent"),
            "run",
            "--node-name=x",
            f"--kubeconfig={kubeconfig}",
            "--simulate-profile=h100-80gb-x8",
            "--metrics-address=",
            *folders(tmp_path),
        ]
        with subprocess.Popen(
            argv, stderr=subprocess.PIPE, text=True, env=clean_env(home=tmp_path), cwd=tmp_path
        ) as agent:
            assert agent.stderr is not None
            seen = []
            for line in agent.stderr:
                seen.append(line)
                if "retrying" in line:
                    break
            agent.send_signal(signal.SIGTERM)
            rest = agent.stderr.read()
            code = agent.wait(timeout=SCRIPT_TIMEOUT_S)
    output = "".join(seen) + rest
    assert code == 0, output
    assert "Traceback" not in output
    assert f"cannot reach the API server https://127.0.0.1:{port}: Connection refused" in seen[-1], output
