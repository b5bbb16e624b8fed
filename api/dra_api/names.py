"""Names shared by the operator and the node agent: API group, drivers, classes, finalizers.

Driver and DeviceClass names follow the vendors' DRA drivers so that manifests and CEL selectors
written for NVIDIA's and Google's drivers work unchanged.
"""

from __future__ import annotations

from typing import Final

RESOURCE_GROUP: Final = "resource.k8s.io"
# Preference order when discovering which version the server serves.
RESOURCE_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")

GPU_DRIVER: Final = "gpu.nvidia.com"
TPU_DRIVER: Final = "tpu.google.com"

GPU_CLASS: Final = "gpu.nvidia.com"
MIG_CLASS: Final = "mig.nvidia.com"
TPU_CLASS: Final = "tpu.google.com"

# Standard attribute domain shared across drivers (resource.kubernetes.io/pcieRoot and friends).
STANDARD_ATTRIBUTE_DOMAIN: Final = "resource.kubernetes.io"

# The project's own domain, for finalizers, annotations, labels and Kopf's prefixes.
PROJECT_DOMAIN: Final = "dra.accel.dev"
OPERATOR_FINALIZER: Final = f"{PROJECT_DOMAIN}/allocation"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "accel-dra-operator"

# Reserved for Kubernetes itself; a third-party allocator must never add or remove it.
KUBERNETES_CLAIM_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
