"""Claim constraints: matchAttribute and distinctAttribute (scalar, or set semantics for lists),
made from a claim's spec.

A constraint reads each device's attribute through the request's lookup (:data:`Lookup`): the
device's own attribute, or one the request derives (DRADerivedAttributes), which shadows it.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_api.attributes import AttributeValue, UnsupportedAttribute, Version
from dra_api.model import ResourceClaim
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.pools import DeviceEntry

# A typed attribute element: (kind, value), so that True and 1 never compare equal.
Element = tuple[str, object]
Value = AttributeValue | UnsupportedAttribute | None
# How a request sees a device's attribute by its name (None: the device has none).
Lookup = Callable[[DeviceEntry, str], Value]


def _element(value: object) -> Element | None:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, Version):
        return ("version", value.text)  # semver strings are canonical: compare them exactly
    return None


def lookup_attribute(entry: DeviceEntry, name: str) -> Value:
    """By full name first; then, if the domain is the device's driver, by the bare identifier."""
    attributes = entry.device.attributes
    found = attributes.get(name)
    if found is None:
        domain, sep, ident = name.partition("/")
        if sep and domain == entry.id[0]:
            found = attributes.get(ident)
    return found


def attribute_set(value: Value, *, lists: bool) -> frozenset[Element] | None:
    """The value as a set of elements; None when it cannot take part (missing, unknown type, or a
    list while list-type attributes are off)."""
    if value is None or isinstance(value, UnsupportedAttribute):
        return None
    if isinstance(value, tuple):
        if not lists:
            return None
        elements = [_element(v) for v in value]
        if any(e is None for e in elements):
            return None
        return frozenset(e for e in elements if e is not None)
    element = _element(value)
    return None if element is None else frozenset((element,))


def attribute_text(value: Value, *, lists: bool) -> str | None:
    """A value as an explanation shows it ("pci0000:15", "1", "[0, 1]"); None when the device
    cannot take part in a constraint on it (see :func:`attribute_set`)."""
    values = attribute_set(value, lists=lists)
    if values is None:
        return None
    texts = sorted(str(v).lower() if isinstance(v, bool) else str(v) for _, v in values)
    return texts[0] if len(texts) == 1 and not isinstance(value, tuple) else "[" + ", ".join(texts) + "]"


def constraint_text(match: str | None, distinct: str | None, requests: tuple[str, ...]) -> str:
    """A constraint as explanations name it: "constraint (matchAttribute <name> on a, b)"."""
    kind = f"matchAttribute {match}" if match else f"distinctAttribute {distinct}"
    on = f" on {', '.join(requests)}" if requests else ""
    return f"constraint ({kind}{on})"


class Constraint:
    """Base: which requests a constraint covers (empty = all requests of the claim)."""

    __slots__ = ("attribute", "index", "lists", "rejections", "requests")

    kind = ""

    def __init__(self, *, index: int, requests: tuple[str, ...], attribute: str, lists: bool) -> None:
        self.index = index
        self.requests = frozenset(requests)
        self.attribute = attribute
        self.lists = lists
        self.rejections = 0  # devices this constraint turned away (for explanations)

    def covers(self, parent: str, full: str) -> bool:
        return not self.requests or parent in self.requests or full in self.requests

    def add(self, parent: str, full: str, entry: DeviceEntry, lookup: Lookup = lookup_attribute) -> bool:
        """Take the device into the constraint if it keeps it satisfied; ``lookup`` may raise
        (an error evaluating a derived attribute), leaving the constraint as it was."""
        raise NotImplementedError

    def remove(self, parent: str, full: str, entry: DeviceEntry) -> None:
        raise NotImplementedError

    def check_values(self, value: Value) -> frozenset[Element] | None:
        """What a device with this attribute value offers the feasibility check: its values, or
        None when the constraint never takes it in a placement with another covered device."""
        return attribute_set(value, lists=self.lists)


class MatchAttribute(Constraint):
    """All covered devices have the attribute with the same type and value (lists: a non-empty
    common intersection)."""

    __slots__ = ("_stack",)
    kind = "matchAttribute"

    def __init__(self, *, index: int, requests: tuple[str, ...], attribute: str, lists: bool) -> None:
        super().__init__(index=index, requests=requests, attribute=attribute, lists=lists)
        # Running intersection after each added device, so remove() is a pop.
        self._stack: list[frozenset[Element]] = []

    def add(self, parent: str, full: str, entry: DeviceEntry, lookup: Lookup = lookup_attribute) -> bool:
        if not self.covers(parent, full):
            return True
        value = lookup(entry, self.attribute)
        if value is None:
            return False
        if not self._stack:
            # The first device fixes the value. Scalar semantics (list-type attributes off) do not
            # check its type: a list or a value of no type is taken, and nothing can join it. Set
            # semantics refuse a value of no type.
            values = attribute_set(value, lists=self.lists)
            if values is None and self.lists:
                return False
            self._stack.append(values if values is not None else frozenset())
            return True
        values = attribute_set(value, lists=self.lists)
        if values is None:
            return False
        common = self._stack[-1] & values
        ok = bool(common) if self.lists else values == self._stack[-1]
        if not ok:
            return False
        self._stack.append(common)
        return True

    def remove(self, parent: str, full: str, entry: DeviceEntry) -> None:
        if self.covers(parent, full):
            self._stack.pop()


class DistinctAttribute(Constraint):
    """Covered devices have pairwise different values (lists: disjoint sets).

    Every covered device's values are kept, in the order added (upstream 1.37 keeps a stack too; 1.36
    kept one entry per request, so a request for several devices compared each only with the last).
    With list-type attributes off, as upstream's scalar comparison: the first device is taken
    whatever its value's type, and a list (or a value of no type) clashes with no scalar after it,
    while a list after the first device is refused."""

    __slots__ = ("_stack",)
    kind = "distinctAttribute"

    def __init__(self, *, index: int, requests: tuple[str, ...], attribute: str, lists: bool) -> None:
        super().__init__(index=index, requests=requests, attribute=attribute, lists=lists)
        self._stack: list[frozenset[Element]] = []

    def add(self, parent: str, full: str, entry: DeviceEntry, lookup: Lookup = lookup_attribute) -> bool:
        if not self.covers(parent, full):
            return True
        value = lookup(entry, self.attribute)
        if value is None:
            return False
        values = attribute_set(value, lists=self.lists)
        if values is None:
            if self.lists or self._stack:
                return False
            values = frozenset()  # scalar semantics: not a scalar, so equal to none
        for seen in self._stack:
            if not seen.isdisjoint(values):
                return False
        self._stack.append(values)
        return True

    def remove(self, parent: str, full: str, entry: DeviceEntry) -> None:
        if self.covers(parent, full):
            self._stack.pop()

    def check_values(self, value: Value) -> frozenset[Element] | None:
        values = attribute_set(value, lists=self.lists)
        if values is None and value is not None and not self.lists:
            return frozenset()  # it may come first, and then clashes with nothing
        return values


def claim_constraints(claim: ResourceClaim, *, ref: str, lists: bool) -> list[Constraint]:
    """The claim's constraints, in the order written (``lists``: DRAListTypeAttributes)."""
    constraints: list[Constraint] = []
    for i, c in enumerate(claim.spec.constraints):
        if c.match_attribute is not None:
            constraints.append(
                MatchAttribute(index=i, requests=c.requests, attribute=c.match_attribute, lists=lists)
            )
        elif c.distinct_attribute is not None:
            constraints.append(
                DistinctAttribute(index=i, requests=c.requests, attribute=c.distinct_attribute, lists=lists)
            )
        else:
            raise AllocationError(
                f"claim {ref}, constraint #{i}: empty constraint (unsupported constraint type?)"
            )
    return constraints
