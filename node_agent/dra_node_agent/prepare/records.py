"""From a checkpoint entry to what the kubelet's types name: the claim, and prepare's answer."""

from __future__ import annotations

from dra_api.kubeletapi.model import ClaimRef, PreparedDevice
from dra_node_agent import checkpoint as cp


def entry_ref(entry: cp.ClaimEntry) -> ClaimRef:
    return ClaimRef(namespace=entry.namespace, name=entry.name, uid=entry.uid)


def answer(entry: cp.ClaimEntry) -> tuple[PreparedDevice, ...]:
    """The kubelet's answer for a recorded claim: one device per allocation result."""
    return tuple(
        PreparedDevice(
            requests=(d.request,),
            pool=d.pool,
            device=d.device,
            cdi_device_ids=d.cdi_device_ids,
            share_id=d.share_id,
        )
        for d in entry.devices
    )
