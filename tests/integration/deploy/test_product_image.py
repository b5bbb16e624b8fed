"""The product image built without Docker (``make image``), checked and then run on a real node.

The image comes from :func:`dra_devcluster.productimage.ensure_product_image` (cached by a hash of
its inputs; a cold build takes under a minute). Its configuration is read back from the OCI
archive; then it is imported into a real node's containerd under the name the manifests use
(``accel-dra:<version>``, which the kubelet resolves to ``docker.io/library/...``) and pods run
both programs: as the image's own user, and as root the way the agent's DaemonSet runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.images import ImageArchive
from dra_devcluster.ociarchive import read_image_archive
from dra_devcluster.productimage import ProductImage, ensure_product_image, project_version
from tests.unit.deploy.render import REPO_ROOT

pytestmark = pytest.mark.cluster

NODE = "image-node-1"
NAMESPACE = "product-image"
VERSION = project_version(REPO_ROOT)


@pytest.fixture(scope="module")
def product_image() -> ProductImage:
    return ensure_product_image(source=REPO_ROOT)


@pytest.fixture(scope="module")
def image_node(local_cluster: LocalCluster, product_image: ProductImage) -> Iterator[RealNode]:
    node = local_cluster.add_real_node(NODE)
    try:
        node.import_images([ImageArchive(name=product_image.reference, path=product_image.path)])
        local_cluster.create_namespace(NAMESPACE)
        yield node
    finally:
        local_cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False
        )
        local_cluster.remove_real_node(NODE)


def test_image_config(product_image: ProductImage) -> None:
    parts = read_image_archive(product_image.path)
    assert product_image.name == f"accel-dra:{VERSION}"
    assert product_image.reference == f"docker.io/library/accel-dra:{VERSION}"
    config = parts["config"]
    image = config["config"]
    assert image["User"] == "65532:65532"
    # The manifests choose the program with `command:`; an entrypoint would be prepended to it.
    assert not image.get("Entrypoint")
    assert image["Cmd"] == ["dra-operator", "run"]
    env = dict(item.split("=", 1) for item in image["Env"])
    assert env["PATH"].split(":")[0] == "/opt/accel-dra/bin"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    labels = image["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    revision = labels["org.opencontainers.image.revision"]
    assert len(revision.removesuffix("-dirty")) == 40, revision
    # No source label (the project has no public URL), and no label names the folder it was built from.
    assert "org.opencontainers.image.source" not in labels
    local = [value for value in labels.values() if str(REPO_ROOT) in value or value.startswith("/")]
    assert not local, labels
    assert labels["org.opencontainers.image.created"] == config["created"]
    assert config["created"].endswith("Z")
    # Two layers (the Debian base, then the venv and the user), one diff_id each.
    assert len(parts["manifest"]["layers"]) == 2
    assert len(config["rootfs"]["diff_ids"]) == 2


def _pod(name: str, *, command: str, run_as_root: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": f"accel-dra:{VERSION}",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if run_as_root:
        # As the agent's DaemonSet does (manifests/base/node-agent-daemonset.yaml).
        container["securityContext"] = {"runAsUser": 0}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def _finished_log(cluster: LocalCluster, node: RealNode, pod: str) -> str:
    def phase() -> str | None:
        status = cluster.get_json("pod", pod, "-n", NAMESPACE).get("status") or {}
        found = status.get("phase")
        return found if found in ("Succeeded", "Failed") else None

    try:
        result = cluster.wait_for(phase, timeout=120, interval=0.5, what=f"pod {pod} to finish")
    except TimeoutError:
        describe = cluster.kubectl("describe", "pod", pod, "-n", NAMESPACE, check=False).stdout
        raise AssertionError(f"pod {pod} did not finish:\n{describe[-3000:]}") from None
    lines = []
    for path in sorted(node.pod_logs_dir.glob(f"{NAMESPACE}_{pod}_*/main/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
            lines.append(parts[3] if len(parts) == 4 else line)
    log = "\n".join(lines)
    assert result == "Succeeded", f"pod {pod} {result}:\n{log}"
    return log


def test_operator_runs_as_the_image_user(local_cluster: LocalCluster, image_node: RealNode) -> None:
    script = (
        "echo uid=$(id -u) gid=$(id -g); "
        "dra-operator run --help; "
        "dra-operator simulate --help; "
        "python -c 'import dra_operator, dra_node_agent, kopf, grpc, re2, pynvml; print(\"imports ok\")'"
    )
    local_cluster.apply([_pod("operator", command=script, run_as_root=False)])
    log = _finished_log(local_cluster, image_node, "operator")
    assert "uid=65532 gid=65532" in log
    assert "usage: dra-operator run" in log, log
    assert "usage: dra-operator simulate" in log, log
    assert "imports ok" in log


def test_node_agent_runs_as_root(local_cluster: LocalCluster, image_node: RealNode) -> None:
    script = "echo uid=$(id -u); dra-node-agent run --help"
    local_cluster.apply([_pod("node-agent", command=script, run_as_root=True)])
    log = _finished_log(local_cluster, image_node, "node-agent")
    assert "uid=0" in log
    assert "usage: dra-node-agent run" in log, log
