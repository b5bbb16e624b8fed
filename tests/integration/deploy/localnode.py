"""What the product's workloads need changed to run on a real node of the local cluster, and only
that: there is no kube-proxy (the API server listens on 127.0.0.1), so the pods use the host's
network and are given the server's address the way kubelet's service variables would; the node's
kubelet keeps its plugin folders and its CDI folder under the node's own folder, so the agent's
hostPath volumes and flags point there; ports come free from the machine (host networking shares
them); the pods are pinned to the node; one operator replica (two would share the host's port).

Used on rendered objects (kustomize) and as a Helm post-renderer:
``python -m tests.integration.deploy.localnode <json settings>`` reads YAML documents on stdin and
writes them adapted on stdout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.cluster import free_port


@dataclass(frozen=True)
class LocalNode:
    node: str
    apiserver_port: str
    registry_dir: str
    plugins_dir: str
    cdi_dir: str
    state_dir: str

    @staticmethod
    def of(node: RealNode, cluster: LocalCluster, *, state_dir: str) -> LocalNode:
        return LocalNode(
            node=node.name,
            apiserver_port=cluster.server.rsplit(":", 1)[1],
            registry_dir=str(node.registry_dir),
            plugins_dir=str(node.plugins_dir),
            cdi_dir=str(node.cdi_dir),
            state_dir=state_dir,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))


# The flag that says where each program serves /healthz and /metrics.
_PORT_FLAGS = {"Deployment": "--metrics-port={port}", "DaemonSet": "--metrics-address=0.0.0.0:{port}"}


def give_port(workload: dict[str, Any]) -> None:
    """A free host port for the workload's /healthz and /metrics (probes and flag together): host
    networking shares ports, so an update's surge pod needs another one than the pod it replaces."""
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    port = free_port()
    (http,) = container["ports"]
    http["containerPort"] = port
    flag = _PORT_FLAGS[workload["kind"]]
    prefix = flag.split("=", 1)[0] + "="
    container["args"] = [*(a for a in container["args"] if not a.startswith(prefix)), flag.format(port=port)]


def adapt(objects: list[dict[str, Any]], local: LocalNode) -> None:
    """Patch the workloads among ``objects`` in place (see the module docstring)."""
    api = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": local.apiserver_port}
    for obj in objects:
        if obj.get("kind") not in ("DaemonSet", "Deployment", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        spec["nodeSelector"] = {"kubernetes.io/hostname": local.node}
        (container,) = spec["containers"]
        container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in api.items())]
        if obj["kind"] == "Job":
            continue
        give_port(obj)
        if obj["kind"] == "Deployment":
            obj["spec"]["replicas"] = 1
            continue
        paths = {
            "plugins-registry": local.registry_dir,
            "plugins": local.plugins_dir,
            "cdi": local.cdi_dir,
            "state": local.state_dir,
        }
        for volume in spec["volumes"]:
            if volume["name"] in paths:
                volume["hostPath"]["path"] = paths[volume["name"]]
                volume["hostPath"]["type"] = "DirectoryOrCreate"
        for mount in container["volumeMounts"]:
            if mount["name"] in paths:
                mount["mountPath"] = paths[mount["name"]]  # the kubelet dials sockets by host path
        flags = ("--kubelet-registry-dir=", "--kubelet-plugins-dir=", "--cdi-dir=", "--state-dir=")
        container["args"] = [
            *(a for a in container["args"] if not a.startswith(flags)),
            f"--kubelet-registry-dir={local.registry_dir}",
            f"--kubelet-plugins-dir={local.plugins_dir}",
            f"--cdi-dir={local.cdi_dir}",
            f"--state-dir={local.state_dir}",
        ]


def main(argv: list[str]) -> int:
    local = LocalNode(**json.loads(argv[0]))
    objects = [d for d in yaml.safe_load_all(sys.stdin.read()) if d]
    adapt(objects, local)
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
