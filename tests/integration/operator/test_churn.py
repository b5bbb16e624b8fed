"""Churn: the operator and kube-scheduler allocate from the same GPUs while claims come and go."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import Operators, assert_no_double_booking, claims_json
from tests.integration.operator.objects import add_gpu_node, claim, claim_template, pod


def _allocated(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in items if (c.get("status") or {}).get("allocation")]


def _dump(items: list[dict[str, Any]]) -> str:
    lines = []
    for c in items:
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        lines.append(
            f"  {c['metadata']['name']}: finalizers={c['metadata'].get('finalizers')} "
            f"devices={[(r['pool'], r['device']) for r in results]} "
            f"reservedFor={[r['name'] for r in status.get('reservedFor') or []]}"
        )
    return "\n".join(lines)


def test_churn_never_double_books(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-churn"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-churn-a", 4)
    add_gpu_node(local_cluster, scratch, "op-churn-b", 4)
    operators.start()
    gpu = operators.gpu_class
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", gpu, check=False).returncode == 0, what="class"
    )
    samples = 0

    def sample_until(predicate: Any, what: str) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            nonlocal samples
            items = claims_json(local_cluster, ns)
            samples += 1
            try:
                assert_no_double_booking(items)  # at every observation, not only at the end
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nclaims:\n{_dump(items)}") from None
            return items if predicate(items) else None

        result: list[dict[str, Any]] = local_cluster.wait_for(check, timeout=120, interval=0.2, what=what)
        return result

    # Round 1: 10 standalone claims (operator) and 4 pods with template claims (scheduler) at once,
    # 14 requests for 8 GPUs.
    objs: list[dict[str, Any]] = [claim_template("tpl", ns, cls=gpu)]
    objs += [claim(f"s{i}", ns, cls=gpu) for i in range(10)]
    objs += [pod(f"p{i}", ns, template="tpl") for i in range(4)]
    local_cluster.apply(objs)
    sample_until(lambda items: len(_allocated(items)) == 8 and len(items) == 14, "8 of 14 allocated")

    # Round 2: free some GPUs from both sides and add more demand at the same time.
    local_cluster.kubectl("delete", "resourceclaim", "s0", "s1", "s2", "-n", ns, "--wait=false")
    local_cluster.kubectl("delete", "pod", "p0", "p1", "-n", ns, "--grace-period=0", "--force")
    local_cluster.apply(
        [claim(f"t{i}", ns, cls=gpu) for i in range(4)] + [pod(f"q{i}", ns, template="tpl") for i in range(2)]
    )

    def settled(items: list[dict[str, Any]]) -> bool:
        names = {c["metadata"]["name"] for c in items}
        return len(_allocated(items)) == 8 and not names & {"s0", "s1", "s2"}

    final = sample_until(settled, "8 allocated after churn")
    assert_no_double_booking(final)
    assert samples > 0
