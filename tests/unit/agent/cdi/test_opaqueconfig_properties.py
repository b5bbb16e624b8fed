"""Properties of the agent's opaque-config validation, over configs a tenant could write: random
JSON never crashes the parser (it accepts, or refuses with ``OpaqueConfigError``), its messages are
one line, and what an accepted config puts into a container's environment stays within the grammar
the module documents. And the bounds: count, bytes and nesting of one claim's configs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_node_agent.cdi import MAX_ENV_ENTRY_BYTES, SpecTooLarge, build_claim_spec
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuHostInfo, string_attr
from dra_node_agent.opaqueconfig import (
    MAX_CONFIG_BYTES_PER_CLAIM,
    MAX_CONFIGS_PER_CLAIM,
    MAX_NESTING,
    GoogleTpuConfig,
    GpuConfig,
    MigDeviceConfig,
    OpaqueConfigError,
    OpaqueConfigParser,
    TpuConfig,
)
from dra_node_agent.tpu.container_env import TpuEnv, tpu_claim_env
from dra_node_agent.tpu.workers import TpuWorkers

GPU = "gpu.nvidia.com"
TPU = "tpu.google.com"
PARSER = OpaqueConfigParser()
# No example database: a fresh clone's run writes nothing into the tree.
PROPERTY = settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# Any JSON value, with keys and strings that include control characters and the schema's words.
WORDS = st.sampled_from(
    ["apiVersion", "kind", "sharing", "strategy", "MPS", "TimeSlicing", "mpsConfig", "timeSlicingConfig",
     "interval", "Long", "workerId", "workerHostnames", "iciResiliency", "logging", "level", "stderrLevel",
     "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit",
     "multiUser", "iommu", "backendPolicy", "env", "hooks", "containerEdits", "mounts", "metadata"]
)  # fmt: skip
TEXT = st.one_of(WORDS, st.text(max_size=40))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)),
    max_leaves=25,
)
API_VERSIONS = st.sampled_from(
    ["resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1beta1", "tpu.resource.google.com/v1alpha1",
     "tpu.google.com/v1alpha1", "v1"]
)  # fmt: skip
KINDS = st.sampled_from(
    ["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig", "TpuConfig", "ComputeDomainChannelConfig", "Pod"]
)


@st.composite
def configs(draw: st.DrawFn) -> Any:
    """A config with a real apiVersion and kind most of the time, and random fields."""
    body = draw(st.dictionaries(TEXT, JSON, max_size=6))
    if draw(st.booleans()):
        body["apiVersion"] = draw(API_VERSIONS)
        body["kind"] = draw(KINDS)
    return body


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, Any]:
    """Well-formed skeletons of each kind with random values where a tenant writes values."""
    value = draw(JSON)
    text = draw(TEXT)
    number = draw(st.one_of(st.integers(min_value=-5, max_value=200), JSON))
    hosts = draw(
        st.lists(st.one_of(TEXT, st.from_regex(r"[a-z0-9][-a-z0-9.]{0,20}", fullmatch=True)), max_size=4)
    )
    choices: list[tuple[str, Any]] = [
        (GPU, {"strategy": draw(st.sampled_from(["MPS", "TimeSlicing", text]))}),
        (GPU, {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": text}}),
        (
            GPU,
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": number,
                    "defaultPinnedDeviceMemoryLimit": draw(
                        st.one_of(TEXT, st.from_regex(r"[0-9]{1,4}[KMG]i", fullmatch=True))
                    ),
                    "defaultPerDevicePinnedMemoryLimit": {text: value},
                    "multiUser": value,
                },
            },
        ),
        (TPU, {"workerId": number, "workerHostnames": hosts, "iciResiliency": value}),
        (TPU, {"logging": {"level": number, "stderrLevel": draw(st.integers(min_value=-2, max_value=5))}}),
    ]
    driver, fields = draw(st.sampled_from(choices))
    if driver == GPU:
        kind = draw(st.sampled_from(["GpuConfig", "MigDeviceConfig"]))
        return driver, {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": fields}
    version = "tpu.google.com/v1alpha1" if "logging" not in fields else "tpu.resource.google.com/v1alpha1"
    return driver, {"apiVersion": version, "kind": "TpuConfig", **fields}


def _parse(driver: str, parameters: Any) -> Any:
    """The config, or None when refused; anything but ``OpaqueConfigError`` fails the test."""
    try:
        return PARSER.parse(driver=driver, parameters=parameters)
    except OpaqueConfigError as exc:
        refusal = str(exc)
    # A refusal is one line: it goes to a log line and to the pod's Event.
    assert "\n" not in refusal, refusal
    assert "\r" not in refusal, refusal
    return None


@PROPERTY
@given(driver=st.sampled_from([GPU, TPU]), parameters=configs())
def test_random_configs_never_crash_the_parser(driver: str, parameters: Any) -> None:
    _parse(driver, parameters)
    _parse(driver, json.dumps(parameters))  # as raw JSON text, too


@PROPERTY
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64)))
def test_random_bytes_never_crash_the_parser(raw: bytes | str) -> None:
    _parse(GPU, raw)


# The grammar of what reaches a container's environment (opaqueconfig's module docstring).
_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:\d+)?")
_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)([eE]\d+|[KMGTPE]i|[kMGTPE])?")
V5P_HOST = TpuHostInfo("v5p", "tpu-v5p-slice", 2, 4, "2x2x4", (2, 2, 1), worker_id=1)


def _env_ok(entry: str) -> None:
    name, _, value = entry.partition("=")
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), entry
    assert not re.search(r"[\x00-\x1f\x7f]", value), entry
    if name in ("TPU_MIN_LOG_LEVEL", "TPU_STDERR_LOG_LEVEL"):
        assert value in ("0", "1", "2", "3"), entry
    elif name == "TPU_WORKER_ID":
        assert value.isdigit(), entry
    elif name == "TPU_WORKER_HOSTNAMES":
        assert value == "localhost" or all(_HOSTNAME.fullmatch(h) for h in value.split(",")), entry
    elif name == "ENABLE_ICI_RESILIENCY":
        assert value in ("true", "false"), entry


@PROPERTY
@given(case=near_valid())
def test_accepted_configs_give_environment_within_the_grammar(case: tuple[str, Any]) -> None:
    driver, parameters = case
    config = _parse(driver, parameters)
    if config is None:
        return
    if isinstance(config, GoogleTpuConfig):
        for entry in config.env():
            _env_ok(entry)
    elif isinstance(config, TpuConfig):
        for entry in tpu_claim_env(host=V5P_HOST, chips=4, driver=TPU, node_name="n", config=config):
            _env_ok(entry)
    else:
        assert isinstance(config, GpuConfig | MigDeviceConfig)
        mps = config.sharing.mps if config.sharing is not None else None
        if mps is not None:
            percentage = mps.default_active_thread_percentage
            assert percentage is None or (isinstance(percentage, int) and 0 <= percentage <= 100)
            limits = [
                mps.default_pinned_device_memory_limit,
                *(mps.default_per_device_pinned_memory_limit or {}).values(),
            ]
            assert all(v is None or _QUANTITY.fullmatch(v) for v in limits), limits


@PROPERTY
@given(
    entries=st.lists(st.one_of(configs(), JSON), max_size=6),
    drivers=st.lists(st.sampled_from([GPU, "x.example.com"]), min_size=6, max_size=6),
)
def test_random_allocation_configs_never_crash(entries: list[Any], drivers: list[str]) -> None:
    config = [
        {"source": "FromClaim", "opaque": {"driver": d, "parameters": e}} if i % 3 else e
        for i, (d, e) in enumerate(zip(drivers, entries, strict=False))
    ]
    refusal = ""
    try:
        PARSER.for_driver(driver=GPU, configs=config, where="claim")
    except OpaqueConfigError as exc:
        refusal = str(exc)
    assert "\n" not in refusal, refusal


def _entry(parameters: Any, driver: str = GPU) -> dict[str, Any]:
    return {"source": "FromClaim", "opaque": {"driver": driver, "parameters": parameters}}


GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}


def test_a_claim_brings_at_most_64_configs_for_this_driver() -> None:
    PARSER.for_driver(driver=GPU, configs=[_entry(GPU_CONFIG)] * MAX_CONFIGS_PER_CLAIM, where="claim")
    with pytest.raises(OpaqueConfigError, match=r"65 opaque configs for gpu\.nvidia\.com, more than the 64"):
        PARSER.for_driver(driver=GPU, configs=[_entry(GPU_CONFIG)] * 65, where="claim")
    # Another driver's entries are not ours to count.
    others = [_entry({"any": 1}, driver="x.example.com")] * 200
    assert PARSER.for_driver(driver=GPU, configs=others, where="claim") == []


def test_a_claims_configs_are_bounded_in_bytes_and_nesting() -> None:
    padded = {**GPU_CONFIG, "metadata": {"annotations": {"pad": "x" * 9000}}}
    entries = [_entry(padded)] * (MAX_CONFIG_BYTES_PER_CLAIM // 9000 + 1)
    with pytest.raises(OpaqueConfigError, match=f"more than the {MAX_CONFIG_BYTES_PER_CLAIM} bytes"):
        PARSER.for_driver(driver=GPU, configs=entries, where="claim")
    deep: Any = "x"
    for _ in range(MAX_NESTING + 1):
        deep = [deep]
    with pytest.raises(OpaqueConfigError, match="levels"):
        PARSER.for_driver(
            driver=GPU, configs=[_entry({**GPU_CONFIG, "metadata": {"d": deep}})], where="claim"
        )
    # As raw JSON text: 10 KiB at most, and nesting that would exhaust Python's recursion is refused.
    with pytest.raises(OpaqueConfigError, match="more than the 10240 of a config"):
        PARSER.parse(driver=GPU, parameters="[" * 20000)
    with pytest.raises(OpaqueConfigError, match=r"not valid JSON|nested more than"):
        PARSER.parse(driver=GPU, parameters="[" * 5000 + "]" * 5000)


def test_an_environment_entry_too_long_for_linux_fails_the_spec() -> None:
    chip = DiscoveredDevice(name="tpu-0", kind="tpu", uuid="u0", attributes={"type": string_attr("tpu")})
    host = TpuHostInfo("v5p", "tpu-v5p-slice", 2, 1, "2x2x4", (1, 1, 1), worker_id=0)
    inventory = DiscoveredInventory(driver=TPU, devices=(chip,), tpu_host=host)
    names = tuple(f"host-{i}-" + "x" * 100 for i in range(1400))
    with pytest.raises(
        SpecTooLarge, match=f"TPU_WORKER_HOSTNAMES would be \\d+ bytes, more than the {MAX_ENV_ENTRY_BYTES}"
    ):
        build_claim_spec(
            claim_uid="0a1b2c3d-0000-4000-8000-000000000001",
            devices=[chip],
            inventory=inventory,
            context=TpuWorkers(worker_id=0, hostnames=names),
            vendor_env=TpuEnv(),
        )
