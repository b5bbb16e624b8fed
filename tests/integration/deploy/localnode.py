"""What the product's workloads need changed to run on a real node of the local cluster, and only
that: there is no kube-proxy and no cluster DNS, so pods reach the API server through the node's
relay on its bridge gateway (:mod:`dra_devcluster.apirelay`), by a name the server's certificate
carries, given through ``hostAliases`` and the variables kubelet would set from the Service; the
node's kubelet keeps its plugin folders and its CDI folder under the node's own folder, so the
agent's hostPath volumes and flags point there; the pods are pinned to the node. Replicas, ports and
the pod network stay as shipped. A workload the chart put on the host network (its
``controller.hostNetwork``) gets the API server's loopback address, a free port and one replica
instead, since host networking shares ports between pods on the node.

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
    gateway: str
    registry_dir: str
    plugins_dir: str
    cdi_dir: str
    state_dir: str

    @staticmethod
    def of(node: RealNode, cluster: LocalCluster, *, state_dir: str) -> LocalNode:
        return LocalNode(
            node=node.name,
            apiserver_port=cluster.server.rsplit(":", 1)[1],
            gateway=node.gateway,
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


# A name the API server's certificate carries; pods resolve it to their node's relay.
API_NAME = "kubernetes.default.svc"


def _set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    kept = [e for e in container.get("env", []) if e["name"] not in values]
    container["env"] = [*kept, *({"name": k, "value": v} for k, v in values.items())]


def adapt(objects: list[dict[str, Any]], local: LocalNode) -> None:
    """Patch the workloads among ``objects`` in place (see the module docstring)."""
    for obj in objects:
        if obj.get("kind") not in ("DaemonSet", "Deployment", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": local.node}
        (container,) = spec["containers"]
        if spec.get("hostNetwork"):
            _set_env(
                container,
                {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": local.apiserver_port},
            )
            if obj["kind"] != "Job":
                give_port(obj)
            if obj["kind"] == "Deployment":
                obj["spec"]["replicas"] = 1  # a second replica on the one node would want the same port
        else:
            spec["hostAliases"] = [{"ip": local.gateway, "hostnames": [API_NAME]}]
            _set_env(
                container,
                {"KUBERNETES_SERVICE_HOST": API_NAME, "KUBERNETES_SERVICE_PORT": local.apiserver_port},
            )
        if obj["kind"] != "DaemonSet":
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
