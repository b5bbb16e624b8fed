"""``compute-domain-daemon`` as the pods run it, on bad input: one line on stderr naming the
problem, exit status 2, never a traceback; ``check`` prints one line and exits 0 only when ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli_errors import one_line_error, run_script

from .conftest import CLIQUE, DOMAIN

POD = {"NODE_NAME": "node-a", "POD_NAME": "daemon-a", "POD_NAMESPACE": "accel-dra", "POD_IP": "10.0.0.1"}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, ["COMPUTE_DOMAIN_UUID is not set", "CDI"]),
        ({"COMPUTE_DOMAIN_UUID": DOMAIN, "CLIQUE_ID": CLIQUE, **POD, "POD_IP": "x"}, ["POD_IP", "not an IP"]),
        (
            {"COMPUTE_DOMAIN_UUID": DOMAIN, **POD, "MAX_NODES_PER_IMEX_DOMAIN": "9999"},
            ["MAX_NODES_PER_IMEX_DOMAIN"],
        ),
        # Outside a pod without a kubeconfig: no ServiceAccount to log in with.
        ({"COMPUTE_DOMAIN_UUID": DOMAIN, **POD}, ["kubeconfig"]),
    ],
)
def test_run_refuses_bad_environment_in_one_line(
    tmp_path: Path, env: dict[str, str], names: list[str]
) -> None:
    result = run_script("compute-domain-daemon", "run", home=tmp_path, env=env)
    one_line_error(result, *names)
    assert result.returncode == 2


def test_check_answers_in_one_line(tmp_path: Path) -> None:
    idle = run_script("compute-domain-daemon", "check", home=tmp_path, env={"COMPUTE_DOMAIN_UUID": DOMAIN})
    assert (idle.returncode, idle.stdout) == (0, "ready: idle, no NVLink clique on this node\n")
    joining = run_script(
        "compute-domain-daemon",
        "check",
        home=tmp_path,
        env={
            "COMPUTE_DOMAIN_UUID": DOMAIN,
            "CLIQUE_ID": CLIQUE,
            "COMPUTE_DOMAIN_DAEMON_CONFIG_DIR": str(tmp_path),
        },
    )
    assert joining.returncode == 1
    assert (
        joining.stdout
        == f"not ready: {tmp_path}/imexd.cfg is not written yet (the daemon is joining its clique)\n"
    )
