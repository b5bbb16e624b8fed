"""The driver's DeviceClasses: what they should be, repairing drift, and validating every class's CEL.

A class the operator made carries ``app.kubernetes.io/managed-by: accel-dra-operator``. A class of the
same name without that label was made by someone else and is never changed. Selectors of every
DeviceClass (users' too) are compiled; one that does not compile gets a Warning Event naming the
expression and the error, once per class generation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from dra_api import computedomains as cd
from dra_api.names import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from dra_operator.base.settings import Settings
from dra_operator.client.errors import Conflict, Gone
from dra_operator.client.kubeapi import KubeApi

logger = logging.getLogger(__name__)

Compiler = Callable[[str], object]
"""Compiles one CEL expression; raises on an invalid one."""


def gpu_selector(driver: str, device_type: str) -> str:
    return f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{device_type}"'


def _attribute(driver: str, name: str) -> str:
    return f'device.attributes["{driver}"].{name}'


EXTENDED = "extendedResourceName"


def desired_classes(settings: Settings, *, extended_resources: bool = True) -> dict[str, dict[str, Any]]:
    """The classes the operator keeps, by name (same selectors as the vendors' drivers; the GPU and
    TPU classes serve their extended resources unless ``extended_resources`` is False)."""
    wanted = {
        settings.gpu_class: (gpu_selector(settings.gpu_driver, "gpu"), settings.gpu_extended_resource_name),
        settings.tpu_class: (
            f'device.driver == "{settings.tpu_driver}"',
            settings.tpu_extended_resource_name,
        ),
    }
    if settings.mig_enabled:
        wanted[settings.mig_class] = (gpu_selector(settings.gpu_driver, "mig"), "")
    if settings.compute_domains:
        # NVIDIA's: channel 0 only (the other channels are never published), and the daemon device
        # (none with host-managed IMEX, where no daemon runs).
        wanted[cd.CHANNEL_CLASS] = (
            f"{gpu_selector(cd.DRIVER, 'channel')} && {_attribute(cd.DRIVER, 'id')} == 0",
            "",
        )
        if settings.compute_domain_imex_mode != "hostManaged":
            wanted[cd.DAEMON_CLASS] = (gpu_selector(cd.DRIVER, "daemon"), "")
    classes = {}
    for name, (expression, extended) in wanted.items():
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
        if extended and extended_resources:
            spec[EXTENDED] = extended
        classes[name] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "spec": spec,
        }
    return classes


def is_managed(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE)


def drifted(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a managed class's selectors, or the extended resource it should serve, differ from
    what the operator wants. Other spec fields (config) are the administrator's and are left alone,
    as is an extended resource the operator was told not to set."""
    spec = actual.get("spec") or {}
    if (spec.get("selectors") or []) != desired["spec"]["selectors"]:
        return True
    want = desired["spec"].get(EXTENDED)
    return want is not None and spec.get(EXTENDED) != want


def default_compiler() -> Compiler:
    from dra_operator.cel import compile_selector

    return compile_selector


def invalid_selectors(obj: Mapping[str, Any], *, compiler: Compiler) -> list[tuple[int, str, str]]:
    """(index, expression, error) for every selector of the class that does not compile."""
    out: list[tuple[int, str, str]] = []
    selectors = (obj.get("spec") or {}).get("selectors") or []
    for i, selector in enumerate(selectors):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            continue
        try:
            compiler(expression)
        except Exception as exc:
            out.append((i, expression, " ".join(str(exc).split())))
    return out


class DeviceClassKeeper:
    """Creates missing managed classes, repairs drifted ones, and reports invalid selectors."""

    def __init__(self, *, api: KubeApi, settings: Settings, compiler: Compiler | None = None) -> None:
        self.api = api
        self.settings = settings
        self.desired = desired_classes(settings)
        self.extended_resources = True
        """False once the API server showed it drops DeviceClass.spec.extendedResourceName."""
        self._compiler = compiler
        self._reported: dict[str, tuple[int, str]] = {}

    @property
    def compiler(self) -> Compiler:
        if self._compiler is None:
            self._compiler = default_compiler()
        return self._compiler

    async def ensure_all(self) -> None:
        for name in self.desired:
            obj = await self.api.get_device_class(name)
            await self.reconcile(name=name, obj=obj)

    async def reconcile(self, *, name: str, obj: Mapping[str, Any] | None) -> None:
        """Called with the class as watched (None when it was deleted)."""
        if obj is not None:
            await self.validate(obj)
        if not self.settings.manage_device_classes or name not in self.desired:
            return
        desired = self.desired[name]
        if obj is None:
            created = await self.api.create_device_class(desired)
            if created is not None:
                logger.info("created DeviceClass %s", name)
                self._check_served(desired, created)
            return
        if not is_managed(obj):
            logger.info("DeviceClass %s exists without the managed-by label; leaving it alone", name)
            return
        if drifted(obj, desired):
            meta = obj.get("metadata") or {}
            spec = {k: v for k, v in desired["spec"].items() if k in ("selectors", EXTENDED)}
            try:
                patched = await self.api.patch_device_class(
                    name=name,
                    body={"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": spec},
                )
            except (Conflict, Gone):
                return  # a newer version is on its way through the watch; judged then
            logger.info("repaired drifted DeviceClass %s", name)
            self._check_served(desired, patched)
            fields = " and ".join(f"spec.{k}" for k in spec)
            await self.api.post_event(
                involved=_involved(obj),
                type_="Normal",
                reason="DeviceClassRepaired",
                message=f"DeviceClass {name}: {fields} reset to the driver's",
            )

    def _check_served(self, desired: Mapping[str, Any], returned: Mapping[str, Any]) -> None:
        """An API server that does not know extendedResourceName (DRAExtendedResource off, or
        Kubernetes before 1.34) drops it: stop asking for it, or the repair would never end."""
        if EXTENDED in desired["spec"] and EXTENDED not in (returned.get("spec") or {}):
            self.extended_resources = False
            self.desired = desired_classes(self.settings, extended_resources=False)
            logger.warning(
                "the API server dropped DeviceClass.spec.%s (DRAExtendedResource off, or Kubernetes "
                "before 1.34): the driver's classes are kept without it, so pods asking for %s "
                "through resources.limits are not served by DRA",
                EXTENDED,
                " or ".join(
                    n
                    for n in (
                        self.settings.gpu_extended_resource_name,
                        self.settings.tpu_extended_resource_name,
                    )
                    if n
                ),
            )

    async def validate(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        bad = invalid_selectors(obj, compiler=self.compiler)
        if not bad:
            self._reported.pop(name, None)
            return
        generation = int(meta.get("generation") or 0)
        signature = (generation, repr(bad))
        if self._reported.get(name) == signature:
            return
        self._reported[name] = signature
        for index, expression, error in bad:
            message = (
                f"DeviceClass {name}: spec.selectors[{index}].cel.expression {expression!r} does not "
                f"compile: {error}"
            )
            logger.warning("%s", message)
            await self.api.post_event(
                involved=_involved(obj), type_="Warning", reason="InvalidSelector", message=message
            )


def _involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", "resource.k8s.io/v1"),
        "kind": "DeviceClass",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }
