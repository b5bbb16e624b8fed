"""The prepare path's Prometheus metrics (registered on import)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PREPARE_SECONDS = Histogram(
    "dra_agent_claim_operation_seconds",
    "Time to prepare or unprepare one claim, by driver and operation.",
    ["driver", "operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OPERATION_ERRORS = Counter(
    "dra_agent_claim_operation_errors_total",
    "Claims whose prepare or unprepare failed, by driver, operation and reason (claim: the claim or "
    "its config is wrong; device-busy; checkpoint-corrupt; checkpoint-full: a bound of the checkpoint; "
    "io: state could not be written; internal).",
    ["driver", "operation", "reason"],
)
CHECKPOINT_ERRORS = Counter(
    "dra_agent_checkpoint_errors_total",
    "Failed reads (corrupt checkpoint) or writes of the prepared-claims checkpoint, by driver and operation.",
    ["driver", "operation"],
)
DEVICE_SETUPS = Counter(
    "dra_agent_device_setups_total",
    "Device set-ups done for prepared claims (a repeated prepare does none), by driver.",
    ["driver"],
)
