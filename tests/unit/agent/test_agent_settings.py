"""Settings: flags over environment over defaults, and clear errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_node_agent import prepare_tools
from dra_node_agent.cli import build_parser
from dra_node_agent.settings import Settings, SettingsError, load_settings


def load(argv: list[str], env: dict[str, str]) -> Settings:
    return load_settings(args=build_parser().parse_args(["run", *argv]), environ=env)


def test_defaults_with_node_name_from_the_downward_api_variable() -> None:
    settings = load([], {"NODE_NAME": "node-a"})
    assert settings.node_name == "node-a"
    assert settings.kubeconfig is None
    assert settings.backends == ("auto",)
    assert settings.simulate_profile == ()
    assert settings.gpu_driver_name == "gpu.nvidia.com"
    assert settings.tpu_driver_name == "tpu.google.com"
    assert settings.kubelet_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert settings.kubelet_plugins_dir == Path("/var/lib/kubelet/plugins")
    assert settings.cdi_dir == Path("/var/run/cdi")
    assert settings.metrics_address == ":8081"
    assert settings.passthrough_support is False
    assert settings.checkpoint_dir(driver="gpu.nvidia.com") == Path("/var/lib/accel-dra/gpu.nvidia.com")
    # MPS: a 1Gi shm tmpfs and a 1Gi cgroup per claim, under /sys/fs/cgroup/accel-dra-mps.
    options = prepare_tools.mps_options(settings)
    assert (options.shm_size, options.memory_limit) == (1 << 30, 1 << 30)
    assert (options.cgroup_parent, options.cgroup_root) == ("accel-dra-mps", Path("/sys/fs/cgroup"))
    other = prepare_tools.mps_options(
        load(
            ["--mps-shm-size=64Mi", "--mps-daemon-memory-limit=2G", "--mps-cgroup-parent="],
            {"NODE_NAME": "n"},
        )
    )
    assert (other.shm_size, other.memory_limit, other.cgroup_parent) == (64 << 20, 2 * 10**9, "")


def test_flag_beats_prefixed_env_beats_alias() -> None:
    env = {"NODE_NAME": "alias", "DRA_AGENT_NODE_NAME": "prefixed", "DRA_AGENT_RESYNC_INTERVAL": "30"}
    assert load([], env).node_name == "prefixed"
    settings = load(["--node-name=flag", "--resync-interval=5"], env)
    assert settings.node_name == "flag"
    assert settings.resync_interval == 5.0
    assert load([], env).resync_interval == 30.0


def test_consumable_shares_is_off_by_default_and_reads_nvidias_values_and_variable() -> None:
    assert load([], {"NODE_NAME": "n"}).consumable_shares == "disabled"
    for value in ("memory", "unlimited", "4", "disabled", ""):
        assert load([f"--consumable-shares={value}"], {"NODE_NAME": "n"}).consumable_shares == value
    # NVIDIA's chart sets CONSUMABLE_SHARES; the agent reads it too.
    assert load([], {"NODE_NAME": "n", "CONSUMABLE_SHARES": "memory"}).consumable_shares == "memory"


def test_lists_and_paths() -> None:
    settings = load(
        ["--simulate-profile=h100-80gb-x8, tpu-v6e-2x4", "--cdi-dir=/tmp/cdi", "--kubeconfig=/k"],
        {"NODE_NAME": "n", "DRA_AGENT_BACKENDS": "nvidia,tpu"},
    )
    assert settings.simulate_profile == ("h100-80gb-x8", "tpu-v6e-2x4")
    assert settings.backends == ("nvidia", "tpu")
    assert settings.cdi_dir == Path("/tmp/cdi")
    assert settings.kubeconfig == "/k"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "node_name is empty"),
        (["--backends=cuda"], {"NODE_NAME": "n"}, "setting backends"),
        (["--resync-interval=soon"], {"NODE_NAME": "n"}, "resync_interval: 'soon' is not a number"),
        (["--resync-interval=0"], {"NODE_NAME": "n"}, "must be greater than 0"),
        (["--tpu-driver-name=gpu.nvidia.com"], {"NODE_NAME": "n"}, "are both"),
        (["--log-level=LOUD"], {"NODE_NAME": "n"}, "log_level"),
        (["--claim-read-attempts=0"], {"NODE_NAME": "n"}, "claim_read_attempts: 0 is less than 1"),
        (["--claim-read-attempts=two"], {"NODE_NAME": "n"}, "claim_read_attempts: 'two' is not an integer"),
        (["--watch-inactivity-timeout=0"], {"NODE_NAME": "n"}, "must be greater than 0"),
        (
            ["--mps-shm-size=lots"],
            {"NODE_NAME": "n"},
            "mps_shm_size: 'lots' is not a quantity of at least 1048576",
        ),
        (["--mps-shm-size=512Ki"], {"NODE_NAME": "n"}, "mps_shm_size: '512Ki' is not a quantity"),
        (["--mps-daemon-memory-limit=1Mi"], {"NODE_NAME": "n"}, "mps_daemon_memory_limit: '1Mi' is not a"),
        (["--mps-cgroup-parent=/abs"], {"NODE_NAME": "n"}, "mps_cgroup_parent: '/abs' is not a relative"),
        (["--mps-cgroup-parent=a/../b"], {"NODE_NAME": "n"}, "mps_cgroup_parent: 'a/../b' is not a relative"),
        (
            ["--passthrough-support=true", "--dynamic-mig=true"],
            {"NODE_NAME": "n"},
            "passthrough_support and dynamic_mig cannot both be on",
        ),
        (["--consumable-shares=half"], {"NODE_NAME": "n"}, "consumable_shares: 'half' is not 'disabled'"),
        (["--consumable-shares=0"], {"NODE_NAME": "n"}, "consumable_shares: '0' is not"),
        ([], {"NODE_NAME": "n", "CONSUMABLE_SHARES": "-2"}, "consumable_shares: '-2' is not"),
        (["--consumable-shares=1000001"], {"NODE_NAME": "n"}, "number of shares from 1 to 1000000"),
        (
            ["--passthrough-support=true", "--consumable-shares=memory"],
            {"NODE_NAME": "n"},
            "passthrough_support and consumable_shares cannot both be on",
        ),
    ],
)
def test_bad_values_name_the_field(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load(argv, env)


@pytest.mark.parametrize(
    "argv",
    [
        ["--compute-domains=true", "--passthrough-support=true"],
        ["--compute-domains=true", "--consumable-shares=memory", "--mps-support=true"],
    ],
)
def test_compute_domains_go_with_passthrough_and_with_shares(argv: list[str]) -> None:
    # The compute-domain driver has its own socket, slice and checkpoint: nothing of it meets a GPU.
    settings = load(argv, {"NODE_NAME": "n"})
    assert settings.compute_domains
    assert settings.passthrough_support or settings.consumable_shares == "memory"


def test_help_reads_like_a_reference(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--node-name", "$NODE_NAME", "--simulate-profile", "$DRA_AGENT_CDI_DIR", "Default: :8081"):
        assert needle in text


def test_instance_comes_from_the_pod_uid() -> None:
    # Per-pod socket names, so an old and a new agent pod overlap during a rolling update.
    assert load([], {"NODE_NAME": "n"}).instance == ""
    assert load([], {"NODE_NAME": "n", "POD_UID": "1234"}).instance == "1234"
    assert load([], {"NODE_NAME": "n", "POD_UID": "1234", "DRA_AGENT_INSTANCE": "5678"}).instance == "5678"


UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
# A kubelet root at the edge: <root>/plugins_registry/gpu.nvidia.com-<UID>-reg.sock adds
# 18 + 15 + 36 + 9 bytes to a 29-byte root, exactly the 107 a unix socket path may have.
EDGE_ROOT = "/r" + "x" * 27


def test_the_longest_socket_path_fits_at_the_edge() -> None:
    settings = load(
        [
            f"--kubelet-registry-dir={EDGE_ROOT}/plugins_registry",
            f"--kubelet-plugins-dir={EDGE_ROOT}/plugins",
        ],
        {"NODE_NAME": "n", "POD_UID": UID},
    )
    assert settings.instance == UID


@pytest.mark.parametrize(
    ("registry", "plugins", "setting", "size"),
    [
        (f"{EDGE_ROOT}x/plugins_registry", f"{EDGE_ROOT}/plugins", "kubelet_registry_dir", 108),
        (f"{EDGE_ROOT}/plugins_registry", "/" + "p" * 60, "kubelet_plugins_dir", 122),
    ],
)
def test_a_socket_path_too_long_names_the_setting_to_shorten(
    registry: str, plugins: str, setting: str, size: int
) -> None:
    with pytest.raises(SettingsError) as caught:
        load(
            [f"--kubelet-registry-dir={registry}", f"--kubelet-plugins-dir={plugins}"],
            {"NODE_NAME": "n", "POD_UID": UID},
        )
    message = str(caught.value)
    flag = "--" + setting.replace("_", "-")
    assert message.startswith(f"setting {setting}: the socket ")
    assert (
        f" would be {size} bytes, more than the 107 a unix socket path may have; choose a shorter {flag}"
        in message
    )


def test_without_a_pod_uid_the_same_folders_leave_room() -> None:
    settings = load(
        [
            f"--kubelet-registry-dir={EDGE_ROOT}x/plugins_registry",
            f"--kubelet-plugins-dir={EDGE_ROOT}/plugins",
        ],
        {"NODE_NAME": "n"},
    )
    assert settings.instance == ""
