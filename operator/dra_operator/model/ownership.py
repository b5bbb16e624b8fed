"""Which claims the operator allocates, and facts about claims the lifecycle decisions need."""

from __future__ import annotations

from collections.abc import Collection

from dra_api.model import ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.base.settings import Ownership

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def pod_owned(claim: ResourceClaim) -> bool:
    """Whether a Pod controls the claim (generated from a template, or an extended-resource claim)."""
    return any(o.kind == "Pod" and o.api_version == "v1" for o in claim.metadata.owner_references)


def generated_from_template(claim: ResourceClaim) -> bool:
    return pod_owned(claim) and POD_CLAIM_NAME_ANNOTATION in claim.metadata.annotations


def request_classes(claim: ResourceClaim) -> set[str]:
    names: set[str] = set()
    for request in claim.spec.requests:
        if request.exactly is not None:
            names.add(request.exactly.device_class_name)
        names.update(s.spec.device_class_name for s in request.first_available)
    return names


def is_ours(claim: ResourceClaim, *, ownership: Ownership, classes: Collection[str]) -> bool:
    """Whether the operator should allocate the claim (it may already hold our finalizer)."""
    if ownership is Ownership.NONE:
        return False
    if EXTENDED_RESOURCE_CLAIM_ANNOTATION in claim.metadata.annotations:
        return False  # the scheduler creates and allocates those itself
    if not request_classes(claim) & set(classes):
        return False
    if ownership is Ownership.ALL:
        return True
    return not pod_owned(claim)


def allocated_by_us(claim: ResourceClaim) -> bool:
    return claim.status.allocation is not None and OPERATOR_FINALIZER in claim.metadata.finalizers
