"""DeviceClasses (names, labels, selectors evaluated with CEL) and the Kopf peering CRDs."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from kopf._cogs.structs import references

from dra_api import names
from tests.unit.deploy.render import OVERLAYS, PEERING_NAME, Obj, of_kind, one


def _device(driver: str, **attributes: Any) -> dict[str, Any]:
    return {"driver": driver, "attributes": {driver: attributes}, "capacity": {driver: {}}}


GPU = _device(names.GPU_DRIVER, type="gpu", productName="NVIDIA H100 80GB HBM3")
MIG = _device(names.GPU_DRIVER, type="mig", profile="1g.10gb")
TPU = _device(names.TPU_DRIVER, tpuGen="v6e", index=0)
OTHER = _device("gpu.example.com", type="gpu")


def _selects(device_class: Obj, device: dict[str, Any]) -> bool:
    environment = celpy.Environment()
    results = []
    for selector in device_class["spec"]["selectors"]:
        program = environment.program(environment.compile(selector["cel"]["expression"]))
        result = program.evaluate({"device": json_to_cel(device)})
        assert isinstance(result, celpy.celtypes.BoolType), f"selector returned {result!r}"
        results.append(bool(result))
    return all(results)


@pytest.mark.parametrize(
    ("class_name", "matches"),
    [
        (names.GPU_CLASS, [GPU]),
        (names.MIG_CLASS, [MIG]),
        (names.TPU_CLASS, [TPU]),
    ],
)
def test_device_classes_select_their_devices(
    rendered: dict[str, list[Obj]], class_name: str, matches: list[dict[str, Any]]
) -> None:
    device_class = one(rendered["simulated"], "DeviceClass", class_name)
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    assert device_class["metadata"]["labels"][names.MANAGED_BY_LABEL] == names.MANAGED_BY_VALUE
    for device in (GPU, MIG, TPU, OTHER):
        assert _selects(device_class, device) == (device in matches), f"{class_name} vs {device}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_ships_the_three_classes(rendered: dict[str, list[Obj]], overlay: str) -> None:
    classes = {o["metadata"]["name"] for o in of_kind(rendered[overlay], "DeviceClass")}
    assert classes == {names.GPU_CLASS, names.MIG_CLASS, names.TPU_CLASS}


def test_peering_crds_are_what_kopf_looks_for(rendered_crds: list[Obj]) -> None:
    crds = {
        o["metadata"]["name"]: o
        for o in of_kind(rendered_crds, "CustomResourceDefinition")
        if o["spec"]["group"] == "kopf.dev"
    }
    expected = {
        references.CLUSTER_PEERINGS_K: ("Cluster", "ClusterKopfPeering"),
        references.NAMESPACED_PEERINGS_K: ("Namespaced", "KopfPeering"),
    }
    assert set(crds) == {f"{s.any_name}.{s.group}" for s in expected}
    for selector, (scope, kind) in expected.items():
        crd = crds[f"{selector.any_name}.{selector.group}"]
        assert crd["spec"]["scope"] == scope
        assert crd["spec"]["names"]["kind"] == kind
        (version,) = crd["spec"]["versions"]
        assert version["name"] == selector.version
        assert version["served"] is True
        assert version["storage"] is True
        # Kopf merge-patches status on the main resource; a status subresource would drop it.
        assert "subresources" not in version
        record = version["schema"]["openAPIV3Schema"]["properties"]["status"]["additionalProperties"]
        assert {"priority", "lifetime", "lastseen"} <= set(record["properties"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_peers_through_its_own_object(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    peering = one(objs, "ClusterKopfPeering", PEERING_NAME)
    assert peering["apiVersion"] == "kopf.dev/v1"
    (container,) = one(objs, "Deployment", "accel-dra-operator")["spec"]["template"]["spec"]["containers"]
    assert f"--peering-name={PEERING_NAME}" in container["args"]


def test_compute_domain_crds_are_nvidias(rendered_crds: list[Obj]) -> None:
    """The ComputeDomain API as NVIDIA's driver serves it: the same group, version, kinds and scope,
    a status subresource for domains and an immutable spec."""
    crds = {o["metadata"]["name"]: o for o in of_kind(rendered_crds, "CustomResourceDefinition")}
    domains = crds["computedomains.resource.nvidia.com"]["spec"]
    cliques = crds["computedomaincliques.resource.nvidia.com"]["spec"]
    for spec, kind in ((domains, "ComputeDomain"), (cliques, "ComputeDomainClique")):
        assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
            "resource.nvidia.com",
            "Namespaced",
            kind,
        )
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    (version,) = domains["versions"]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert schema["spec"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
    ]
    channel = schema["spec"]["properties"]["channel"]["properties"]
    assert channel["allocationMode"]["enum"] == ["All", "Single"]
    assert channel["allocationMode"]["default"] == "Single"
    assert schema["status"]["properties"]["nodes"]["x-kubernetes-list-map-keys"] == ["name"]
    (clique_version,) = cliques["versions"]
    daemons = clique_version["schema"]["openAPIV3Schema"]["properties"]["daemons"]
    assert daemons["x-kubernetes-list-map-keys"] == ["nodeName"]
    assert "subresources" not in clique_version  # the daemons write the whole object
