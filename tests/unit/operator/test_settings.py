from __future__ import annotations

import pytest

from dra_operator.base.settings import Ownership, parse


def test_flags_win_over_environment_and_defaults() -> None:
    settings = parse(
        ["--ownership", "all", "--gpu-class", "flag-gpu"],
        env={"DRA_OPERATOR_GPU_CLASS": "env-gpu", "DRA_OPERATOR_TPU_CLASS": "env-tpu"},
    )
    assert settings.ownership is Ownership.ALL
    assert settings.gpu_class == "flag-gpu"
    assert settings.tpu_class == "env-tpu"
    assert settings.mig_class == "mig.nvidia.com"


def test_environment_types_are_converted() -> None:
    settings = parse(
        [],
        env={
            "DRA_OPERATOR_MIG_ENABLED": "true",
            "DRA_OPERATOR_HEARTBEAT_INTERVAL": "2.5",
            "DRA_OPERATOR_METRICS_PORT": "9090",
        },
    )
    assert settings.mig_enabled is True
    assert settings.heartbeat_interval_s == 2.5
    assert settings.metrics_port == 9090
    assert settings.managed_class_names() == ("gpu.nvidia.com", "tpu.google.com", "mig.nvidia.com")


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="DRA_OPERATOR_MIG_ENABLED"):
        parse([], env={"DRA_OPERATOR_MIG_ENABLED": "maybe"})


def test_manifest_peering_flag_is_accepted() -> None:
    # The Deployment passes --peering=accel-dra-operator (an unambiguous prefix of --peering-name).
    assert parse(["--peering=other"], env={}).peering_name == "other"


def test_default_priorities_differ_between_instances() -> None:
    priorities = {parse([], env={}).priority for _ in range(5)}
    assert len(priorities) > 1


def test_max_concurrent_writes_from_flag_or_environment_and_at_least_one() -> None:
    assert parse([]).max_concurrent_writes == 8
    assert parse([], env={"DRA_OPERATOR_MAX_CONCURRENT_WRITES": "3"}).max_concurrent_writes == 3
    flagged = parse(["--max-concurrent-writes", "5"], env={"DRA_OPERATOR_MAX_CONCURRENT_WRITES": "3"})
    assert flagged.max_concurrent_writes == 5
    with pytest.raises(ValueError, match="max_concurrent_writes"):
        parse(["--max-concurrent-writes", "0"])


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["--scheduler-grace-seconds=2"], {}), ([], {"DRA_OPERATOR_SCHEDULER_GRACE": "2"})],
)
def test_the_deprecated_scheduler_grace_still_starts_and_says_it_has_no_effect(
    argv: list[str], env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    assert parse(argv, env=env).scheduler_headroom == 2
    assert "deprecated and has no effect" in caplog.text


def test_without_the_deprecated_flag_nothing_is_said(caplog: pytest.LogCaptureFixture) -> None:
    parse([], env={})
    assert "deprecated" not in caplog.text
