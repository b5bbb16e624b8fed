"""The chart's uninstall hook on a real node: with a claim the operator allocated, `helm uninstall`
is refused by the pre-delete hook (the release stays, the operator keeps running, the Job's log
names the claim and says what to do); after `helm upgrade --set uninstall.releaseClaims=true` the
hook stops the operator, deallocates the claim and removes the finalizer, and the uninstall goes
through, leaving a claim that can be deleted.

The chart's pods run from the product image on a real node; Helm's post-renderer
(``localnode``) makes the only changes this local cluster needs (the API server's address, the
node's folders). The operator and the hook Job run in the host's network (``controller.hostNetwork``),
because Helm 3 does not pass hooks through a post-renderer and the hook's pod could not otherwise
be given the API server's address.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.binaries import ensure_helm
from dra_devcluster.images import ImageArchive
from dra_devcluster.productimage import ensure_product_image
from tests.integration.deploy.localnode import LocalNode
from tests.integration.deploy.test_helm import Helm, _set_aside
from tests.unit.deploy.helm_render import CHART_DIR
from tests.unit.deploy.render import REPO_ROOT

pytestmark = pytest.mark.cluster

NODE = "hm-1"
NAMESPACE = "accel-dra-hook"
RELEASE = "accel-dra"
CLAIMS_NS = "hook-claims"
FINALIZER = "dra.accel.dev/allocation"


@dataclass
class Setup:
    cluster: LocalCluster
    node: RealNode
    helm: Helm
    post_renderer: Path

    def chart(self, verb: str, *values: str, check: bool = True) -> Any:
        # Helm 3 does not pass hooks through a post-renderer: the hook Job gets the local cluster's
        # needs from the chart's own values (host network, the API server's address, the node).
        api = [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": self.cluster.server.rsplit(":", 1)[1]},
        ]
        values = (
            "backend=simulated",
            "simulated.profiles={h100-80gb-x8}",
            "controller.hostNetwork=true",
            f"controller.nodeSelector.kubernetes\\.io/hostname={NODE}",
            *values,
        )
        flags = [*(f"--set={v}" for v in values), f"--set-json=controller.extraEnv={json.dumps(api)}"]
        renderer = ("--post-renderer", str(self.post_renderer))
        return self.helm(verb, RELEASE, str(CHART_DIR), "-n", NAMESPACE, *flags, *renderer, check=check)

    def ready(self, name: str) -> None:
        def ready() -> bool:
            pods = self.cluster.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={name}")[
                "items"
            ]
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for p in pods
                for c in (p.get("status") or {}).get("conditions") or []
            )

        try:
            self.cluster.wait_for(ready, timeout=180, interval=1, what=f"a ready {name} pod")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.pods_report(name)}") from None

    def pods_report(self, name: str) -> str:
        """The pods' status and their containers' log tails, for a failure message."""
        pods = self.cluster.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={name}", "-o", "yaml", check=False
        ).stdout
        logs = sorted(self.node.pod_logs_dir.glob(f"{NAMESPACE}_{name}-*/*/*.log"))
        tails = "\n".join(
            f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]) for p in logs
        )
        return f"{pods[-4000:]}\n{tails[-6000:]}"

    def job_log(self) -> str:
        paths = sorted(self.node.pod_logs_dir.glob(f"{NAMESPACE}_accel-dra-release-claims-*/*/*.log"))
        return "\n".join(p.read_text(errors="replace") for p in paths)

    def claim(self) -> dict[str, Any]:
        result: dict[str, Any] = self.cluster.get_json("resourceclaim", "held", "-n", CLAIMS_NS)
        return result


@pytest.fixture(scope="module")
def setup(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    cluster = local_cluster
    image = ensure_product_image(source=REPO_ROOT)
    node = cluster.add_real_node(NODE)
    home = tmp_path_factory.mktemp("helm-hook")
    local = LocalNode.of(node, cluster, state_dir=str(home / "agent-state"))
    wrapper = home / "post-render"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"cd {shlex.quote(str(REPO_ROOT))}\n"
        f"exec {shlex.quote(sys.executable)} -m tests.integration.deploy.localnode "
        f"{shlex.quote(local.to_json())}\n"
    )
    wrapper.chmod(0o755)
    helm = Helm(ensure_helm(), cluster, home)
    saved = _set_aside(cluster, helm.binary)
    try:
        node.import_images([ImageArchive(name=image.reference, path=image.path)])
        cluster.create_namespace(NAMESPACE, labels={"pod-security.kubernetes.io/enforce": "privileged"})
        cluster.create_namespace(CLAIMS_NS)
        yield Setup(cluster=cluster, node=node, helm=helm, post_renderer=wrapper)
    finally:
        # A failed test may leave the claim holding the finalizer with no operator to remove it.
        unheld = '{"metadata":{"finalizers":null}}'
        cluster.kubectl(
            "patch", "resourceclaim", "held", "-n", CLAIMS_NS, "--type=merge", "-p", unheld, check=False
        )
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", "--ignore-not-found", check=False)
        for namespace in (CLAIMS_NS, NAMESPACE):
            waited = ("--ignore-not-found", "--wait=true", "--timeout=120s")
            cluster.kubectl("delete", "namespace", namespace, *waited, check=False)
        for crd in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
            cluster.kubectl("delete", "crd", crd, "--ignore-not-found", check=False)
        mine = f"--field-selector=spec.nodeName={NODE}"
        cluster.kubectl("delete", "resourceslices", mine, "--ignore-not-found", check=False)
        cluster.remove_real_node(NODE)
        if saved:
            cluster.apply(saved)


def test_uninstall_is_refused_while_the_operator_holds_a_claim_and_releases_it_when_asked(
    setup: Setup,
) -> None:
    cluster = setup.cluster
    setup.chart("install")
    setup.ready("accel-dra-operator")
    setup.ready("accel-dra-node-agent")
    cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "held", "namespace": CLAIMS_NS},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                    }
                },
            }
        ]
    )
    cluster.wait_for(
        lambda: (setup.claim().get("status") or {}).get("allocation"),
        timeout=90,
        what="the operator allocating",
    )
    assert FINALIZER in setup.claim()["metadata"]["finalizers"]

    # Refused: the hook fails, nothing of the release is removed, the Job says what to do.
    refused = setup.helm("uninstall", RELEASE, "-n", NAMESPACE, "--timeout=180s", check=False)
    assert refused.returncode != 0, refused.stdout
    assert "job accel-dra-release-claims failed" in refused.stderr, refused.stderr
    log = setup.job_log()
    assert f"{CLAIMS_NS}/held (allocated)" in log, log
    assert "uninstall.releaseClaims=true" in log, log
    assert cluster.get_json("deployment", "accel-dra-operator", "-n", NAMESPACE)["spec"]["replicas"] == 1
    assert (setup.claim().get("status") or {}).get("allocation")

    # Released: the stopped uninstall left the release "uninstalling"; a rollback makes it deployed
    # again, the upgrade sets the value. The hook stops the operator first, then lets the claim go.
    status = json.loads(setup.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert status["info"]["status"] == "uninstalling"
    setup.helm("rollback", RELEASE, "1", "-n", NAMESPACE)
    upgraded = setup.chart("upgrade", "uninstall.releaseClaims=true", check=False)
    assert upgraded.returncode == 0, f"helm upgrade after the refused uninstall: {upgraded.stderr}"
    setup.ready("accel-dra-operator")
    released = setup.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s", check=False)
    assert released.returncode == 0, f"{released.stderr}\n{setup.job_log()}"
    claim = setup.claim()
    assert FINALIZER not in (claim["metadata"].get("finalizers") or [])
    assert not (claim.get("status") or {}).get("allocation")
    assert setup.helm("status", RELEASE, "-n", NAMESPACE, check=False).returncode != 0
    cluster.kubectl("delete", "resourceclaim", "held", "-n", CLAIMS_NS, "--wait=true", "--timeout=30s")
    # The succeeded hook's objects are gone with it (hook-succeeded).
    assert not json.loads(cluster.kubectl("get", "jobs", "-n", NAMESPACE, "-o", "json").stdout)["items"]
