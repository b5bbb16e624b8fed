"""Kopf's connection to the API server: from a kubeconfig file, or from the pod's ServiceAccount.

In a pod, the API server is where ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT`` say,
as client-go's in-cluster config and the operator's own client (kubernetes_asyncio) read it. Kopf's
built-in service-account login addresses ``https://kubernetes.default.svc`` instead, which needs
cluster DNS: a host-network pod without ``ClusterFirstWithHostNet``, or a cluster whose DNS is down,
would leave Kopf's watches retrying forever while the rest of the operator runs.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FALLBACK_SERVER = "https://kubernetes.default.svc"


def _data(entry: dict[str, Any], key: str) -> str | None:
    raw = entry.get(f"{key}-data")
    return base64.b64decode(raw).decode() if raw else None


def kubeconfig_login(path: str) -> kopf.ConnectionInfo:
    """The connection of a kubeconfig file's current context (certificates, or a token)."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    context_name = config.get("current-context")
    contexts = {c["name"]: c.get("context") or {} for c in config.get("contexts", [])}
    if context_name not in contexts:
        raise kopf.LoginError(f"kubeconfig {path}: current-context {context_name!r} is not defined")
    context = contexts[context_name]
    cluster = {c["name"]: c.get("cluster") or {} for c in config.get("clusters", [])}[context["cluster"]]
    user = {u["name"]: u.get("user") or {} for u in config.get("users", [])}.get(context.get("user"), {})
    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_path=cluster.get("certificate-authority"),
        ca_data=_data(cluster, "certificate-authority"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        token=user.get("token"),
        scheme="Bearer" if user.get("token") else None,
        certificate_path=user.get("client-certificate"),
        certificate_data=_data(user, "client-certificate"),
        private_key_path=user.get("client-key"),
        private_key_data=_data(user, "client-key"),
        default_namespace=context.get("namespace"),
    )


def in_cluster_server(environ: Mapping[str, str]) -> str:
    """The API server's URL as the pod's environment gives it (IPv6 addresses bracketed)."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return FALLBACK_SERVER
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{port}"


def service_account_login(
    environ: Mapping[str, str], *, directory: Path = SERVICE_ACCOUNT_DIR, trust_env: bool = False
) -> kopf.ConnectionInfo | None:
    """The pod's ServiceAccount token, read again on every login (Kopf logs in again on a 401,
    and the kubelet rotates projected tokens), or None outside a pod."""
    token_path = directory / "token"
    if not token_path.exists():
        return None
    token = token_path.read_text(encoding="utf-8").strip()
    namespace_path = directory / "namespace"
    namespace = namespace_path.read_text(encoding="utf-8").strip() if namespace_path.exists() else ""
    ca_path = directory / "ca.crt"
    return kopf.ConnectionInfo(
        server=in_cluster_server(environ),
        ca_path=str(ca_path) if ca_path.exists() else None,
        token=token or None,
        scheme="Bearer" if token else None,
        default_namespace=namespace or None,
        trust_env=trust_env,  # Kopf's setting: whether proxy variables apply
    )
