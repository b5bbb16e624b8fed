"""Compiled device selectors with per-projection memoization.

Even compiled to closures (``compiler.py``), a selector evaluation costs tens of microseconds
including the conversion of the device to CEL values (cel-python's own interpreter: about a
millisecond), which adds up over thousands of devices and several selectors per request. Each
:class:`CompiledSelector` therefore remembers its result (or error) keyed by the projection of the
device onto what the expression reads (see ``projection.py``): devices that differ only in
attributes the selector never looks at share one evaluation. The memo is a bounded LRU.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from celpy import celtypes
from celpy.evaluation import CELEvalError

from dra_api.attributes import AttributeValue, UnsupportedAttribute, Version
from dra_api.quantity import Quantity

from .budget import BudgetExhausted, check_current, current
from .checker import check
from .compiler import COST_KEY, CostLimitExceeded, DomainMap, Program, compile_program
from .errors import CelCompileError, CelRuntimeError
from .parser import parse
from .projection import DeviceReads, analyse
from .values import attribute_to_cel, cel_kind

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "MEMO_SIZE",
    "CompiledSelector",
    "DeviceInput",
    "compile_selector",
    "evaluation_count",
]

logger = logging.getLogger(__name__)

# resource.k8s.io CELSelectorExpressionMaxLength, in bytes.
MAX_EXPRESSION_LENGTH: Final = 10240
# Distinct device projections remembered per selector.
MEMO_SIZE: Final = 4096
# Compiled selectors kept by expression text.
COMPILE_CACHE_SIZE: Final = 1024
# The longest selector compiled on the event loop (characters): about 70 ms at the slowest this
# machine compiles (long list literals); a longer one is compiled in a worker thread.
INLINE_COMPILE_BYTES: Final = 256

_MISSING: Final = ("missing",)

T = TypeVar("T")

_count_lock = threading.Lock()
_evaluations = 0


def evaluation_count() -> int:
    """Process-wide number of real CEL evaluations (memo hits excluded)."""
    return _evaluations


def _count_one() -> None:
    global _evaluations
    with _count_lock:
        _evaluations += 1


@dataclass(frozen=True, slots=True, eq=False)
class DeviceInput:
    """A device as a selector sees it.

    Attribute and capacity keys are as in the ResourceSlice: ``"domain/name"``, or ``"name"`` for the
    driver's own domain.
    """

    driver: str
    attributes: Mapping[str, AttributeValue | UnsupportedAttribute]
    capacity: Mapping[str, Quantity]
    allow_multiple_allocations: bool = False


def _split_key(key: str, driver: str) -> tuple[str, str]:
    domain, sep, name = key.partition("/")
    return (domain, name) if sep else (driver, key)


def _typed_scalar(value: Any) -> Hashable:
    # Tag by type: True == 1 in Python, but not in CEL.
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, Version):
        return ("v", value.text)
    raise CelRuntimeError(f"unsupported attribute value {value!r}")


def _typed_attribute(value: AttributeValue | UnsupportedAttribute) -> Hashable:
    if isinstance(value, tuple):
        return ("l", tuple(_typed_scalar(v) for v in value))
    return _typed_scalar(value)


def _typed_quantity(value: Quantity) -> Hashable:
    return (value.nanos, value.format.value)


def _lookup(mapping: Mapping[str, Any], *, driver: str, domain: str, name: str) -> Any:
    value = mapping.get(f"{domain}/{name}", _MISSING)
    if value is _MISSING and domain == driver:
        value = mapping.get(name, _MISSING)
    return value


def _domain_entries(mapping: Mapping[str, Any], *, driver: str, domain: str | None) -> dict[str, Any]:
    """Entries of one domain (or of all domains, keyed "domain/name"), qualified names winning."""
    out: dict[str, Any] = {}
    # Unqualified first so that an explicit "driver/name" entry overrides it, as in _lookup.
    for key in sorted(mapping, key=lambda k: "/" in k):
        dom, name = _split_key(key, driver)
        if domain is None:
            out[f"{dom}/{name}"] = mapping[key]
        elif dom == domain:
            out[name] = mapping[key]
    return out


def _check_attributes(device: DeviceInput) -> None:
    if not any(isinstance(v, UnsupportedAttribute) for v in device.attributes.values()):
        return
    for key in sorted(device.attributes):
        value = device.attributes[key]
        if isinstance(value, UnsupportedAttribute):
            raise CelRuntimeError(f"attribute {key}: {value.reason}")


def _domain_maps(
    mapping: Mapping[str, Any],
    *,
    driver: str,
    convert: Any,
    entries: set[tuple[str, str]] | None,
    domains: set[str] | None,
) -> DomainMap:
    """Build ``device.attributes`` or ``device.capacity``.

    With ``entries``/``domains`` given, only those parts are converted: the projection analysis
    guarantees the expression reads nothing else, and conversion dominates the cost otherwise.
    """
    maps: dict[str, dict[Any, Any]] = {}
    if entries is None or domains is None:
        for key, value in _domain_entries(mapping, driver=driver, domain=None).items():
            dom, _, name = key.partition("/")
            maps.setdefault(dom, {})[celtypes.StringType(name)] = convert(value)
    else:
        for dom in domains:
            for name, value in _domain_entries(mapping, driver=driver, domain=dom).items():
                maps.setdefault(dom, {})[celtypes.StringType(name)] = convert(value)
        for dom, name in entries:
            value = _lookup(mapping, driver=driver, domain=dom, name=name)
            if value is not _MISSING:
                maps.setdefault(dom, {})[celtypes.StringType(name)] = convert(value)
    out = DomainMap()
    # dict.update: MapType's own constructor checks every key in Python, which is slow.
    for dom, entries_of_domain in maps.items():
        inner = celtypes.MapType()
        dict.update(inner, entries_of_domain)
        dict.__setitem__(out, celtypes.StringType(dom), inner)
    return out


def _identity(value: Any) -> Any:
    return value


def _to_cel(device: DeviceInput, reads: DeviceReads) -> celtypes.MapType:
    def part(kind: str) -> tuple[set[tuple[str, str]] | None, set[str] | None]:
        if reads.whole_device or kind in reads.whole_kind:
            return None, None
        entries = {(d, n) for k, d, n in reads.entries if k == kind}
        return entries, {d for k, d in reads.domains if k == kind}

    attr_entries, attr_domains = part("attributes")
    cap_entries, cap_domains = part("capacity")
    out = celtypes.MapType()
    dict.update(
        out,
        {
            _DRIVER: celtypes.StringType(device.driver),
            _ATTRIBUTES: _domain_maps(
                device.attributes,
                driver=device.driver,
                convert=attribute_to_cel,
                entries=attr_entries,
                domains=attr_domains,
            ),
            _CAPACITY: _domain_maps(
                device.capacity,
                driver=device.driver,
                convert=_identity,
                entries=cap_entries,
                domains=cap_domains,
            ),
            _ALLOW_MULTIPLE: _TRUE if device.allow_multiple_allocations else _FALSE,
        },
    )
    return out


_DRIVER: Final = celtypes.StringType("driver")
_ATTRIBUTES: Final = celtypes.StringType("attributes")
_CAPACITY: Final = celtypes.StringType("capacity")
_ALLOW_MULTIPLE: Final = celtypes.StringType("allowMultipleAllocations")
_TRUE: Final = celtypes.BoolType(True)
_FALSE: Final = celtypes.BoolType(False)


class _Projector:
    """Builds the memo key of a device for one selector's reads."""

    def __init__(self, reads: DeviceReads) -> None:
        self.reads = reads
        self.attr_entries = sorted((d, n) for k, d, n in reads.entries if k == "attributes")
        self.cap_entries = sorted((d, n) for k, d, n in reads.entries if k == "capacity")
        self.attr_domains = sorted(d for k, d in reads.domains if k == "attributes")
        self.cap_domains = sorted(d for k, d in reads.domains if k == "capacity")

    def key(self, device: DeviceInput) -> Hashable:
        reads = self.reads
        drv = device.driver
        if reads.whole_device:
            return (
                drv,
                device.allow_multiple_allocations,
                self._all(device.attributes, drv, attribute=True),
                self._all(device.capacity, drv, attribute=False),
            )
        parts: list[Hashable] = [
            drv if reads.driver else None,
            device.allow_multiple_allocations if reads.allow_multiple else None,
        ]
        attrs, caps = device.attributes, device.capacity
        for dom, name in self.attr_entries:
            value = _lookup(attrs, driver=drv, domain=dom, name=name)
            parts.append(_MISSING if value is _MISSING else _typed_attribute(value))
        for dom, name in self.cap_entries:
            value = _lookup(caps, driver=drv, domain=dom, name=name)
            parts.append(_MISSING if value is _MISSING else _typed_quantity(value))
        for dom in self.attr_domains:
            entries = _domain_entries(attrs, driver=drv, domain=dom)
            parts.append(tuple(sorted((n, _typed_attribute(v)) for n, v in entries.items())))
        for dom in self.cap_domains:
            entries = _domain_entries(caps, driver=drv, domain=dom)
            parts.append(tuple(sorted((n, _typed_quantity(v)) for n, v in entries.items())))
        if "attributes" in reads.whole_kind:
            parts.append(self._all(attrs, drv, attribute=True))
        if "capacity" in reads.whole_kind:
            parts.append(self._all(caps, drv, attribute=False))
        return tuple(parts)

    @staticmethod
    def _all(mapping: Mapping[str, Any], driver: str, *, attribute: bool) -> Hashable:
        entries = _domain_entries(mapping, driver=driver, domain=None)
        typed = _typed_attribute if attribute else _typed_quantity
        return tuple(sorted((k, typed(v)) for k, v in entries.items()))


class MemoizedExpression(Generic[T]):
    """A compiled expression whose results (or errors) are remembered per device projection.
    Safe to call from several threads."""

    #: Whether a "no such key" error gets upstream's hint (selectors do, derived attributes not).
    _hint = True

    def __init__(self, *, expression: str, program: Program, reads: DeviceReads) -> None:
        self.expression = expression
        self.reads = reads
        self.evaluations = 0
        self._program = program
        self._projector = _Projector(reads)
        self._memo: OrderedDict[Hashable, T | CelRuntimeError] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.expression!r})"

    def _value(self, device: DeviceInput) -> T:
        _check_attributes(device)
        key = self._projector.key(device)
        with self._lock:
            cached = self._memo.get(key)
            if cached is not None:
                self._memo.move_to_end(key)
        if cached is None:
            cached = self._evaluate(device)
            with self._lock:
                self._memo[key] = cached
                if len(self._memo) > MEMO_SIZE:
                    self._memo.popitem(last=False)
        if isinstance(cached, CelRuntimeError):
            raise CelRuntimeError(str(cached))
        return cached

    def memo_size(self) -> int:
        return len(self._memo)

    def _convert(self, result: Any) -> T | CelRuntimeError:
        raise NotImplementedError

    def _evaluate(self, device: DeviceInput) -> T | CelRuntimeError:
        check_current()  # the placement's budget, before any work: an evaluation can take 0.4 s
        with self._lock:
            self.evaluations += 1
        _count_one()
        try:
            result = self._program({"device": _to_cel(device, self.reads), COST_KEY: [0]})
        except BudgetExhausted:
            raise  # not an answer about the device: nothing is remembered
        except CostLimitExceeded as exc:
            return CelRuntimeError(str(exc))
        except RecursionError:
            return CelRuntimeError("expression nested too deeply")
        except Exception as exc:  # a cel-python internal failure must not take the allocator down
            logger.warning("CEL evaluation of %r failed unexpectedly", self.expression, exc_info=True)
            return CelRuntimeError(f"evaluation failed: {type(exc).__name__}: {exc}")
        if isinstance(result, CELEvalError):
            return CelRuntimeError(_eval_message(result, hint=self._hint))
        return self._convert(result)


class CompiledSelector(MemoizedExpression[bool]):
    """A compiled CEL device selector. ``matches`` is safe to call from several threads."""

    def matches(self, device: DeviceInput) -> bool:
        """Whether the device satisfies the selector; CelRuntimeError if evaluation fails."""
        return self._value(device)

    def _convert(self, result: Any) -> bool | CelRuntimeError:
        if isinstance(result, celtypes.BoolType | bool):
            return bool(result)
        return CelRuntimeError(f"expression result is {cel_kind(result)}, not bool")


_KEY_HINT: Final = (
    ". consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has()"
    " for optional fields"
)


def _eval_message(exc: CELEvalError, *, hint: bool) -> str:
    message = str(exc.args[0]) if exc.args else "evaluation error"
    # cel-python appends a dump of the whole activation to some messages.
    message = message.split(" (in activation", 1)[0]
    if hint and message.startswith("no such key:"):
        message += _KEY_HINT  # the hint upstream adds to the same error
    return message


# Compiled expressions by (kind, text): "selector" or "derived" (a derived attribute's expression
# compiles to another result type), errors too.
_compiled: OrderedDict[tuple[str, str], MemoizedExpression[Any] | CelCompileError] = OrderedDict()
_compiled_lock = threading.Lock()
_compiling_later: set[tuple[str, str]] = set()
_compile_executor: ThreadPoolExecutor | None = None

M = TypeVar("M", bound=MemoizedExpression[Any])


def is_compiled(expression: str, *, kind: str = "selector") -> bool:
    """Whether ``expression``'s compilation (or its error) is cached."""
    with _compiled_lock:
        return (kind, expression) in _compiled


def compile_selector(expression: str) -> CompiledSelector:
    """Compile a selector (cached by text, errors too); CelCompileError says what is wrong with it.

    Compiling is not interruptible and grows with the text (a 10 KiB selector can take seconds),
    so within a slice of the event loop (see ``budget.py``) a selector longer than
    :data:`INLINE_COMPILE_BYTES` that is not cached yet is not compiled: it is handed to a worker
    thread and :class:`~dra_operator.cel.budget.BudgetExhausted` says to come back later."""
    return compile_cached("selector", expression, _compile, CompiledSelector)


def compile_cached(kind: str, expression: str, build: Callable[[str], M], result: type[M]) -> M:
    """``build(expression)``, cached under (``kind``, text) with its errors, and compiled off the
    event loop when long (see :func:`compile_selector`)."""
    key = (kind, expression)
    with _compiled_lock:
        found = _compiled.get(key)
        if found is not None:
            _compiled.move_to_end(key)
    if found is None:
        budget = current()
        if budget is not None:
            budget.check()
            if budget.on_loop and len(expression) > INLINE_COMPILE_BYTES:
                _compile_later(key, lambda: compile_cached(kind, expression, build, result))
                raise BudgetExhausted(budget)
        try:
            found = build(expression)
        except CelCompileError as exc:
            found = exc
        with _compiled_lock:
            _compiled[key] = found
            if len(_compiled) > COMPILE_CACHE_SIZE:
                _compiled.popitem(last=False)
    if isinstance(found, CelCompileError):
        raise CelCompileError(str(found))
    assert isinstance(found, result)
    return found


def _compile_later(key: tuple[str, str], compile_it: Callable[[], object]) -> None:
    """Compile in the background (one worker thread), so that the next look finds it cached."""
    global _compile_executor
    with _compiled_lock:
        if key in _compiling_later:
            return
        _compiling_later.add(key)
        if _compile_executor is None:
            _compile_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cel-compile")
        executor = _compile_executor

    def run() -> None:
        try:
            compile_it()
        except CelCompileError:
            pass  # cached: the caller meets it next time
        finally:
            with _compiled_lock:
                _compiling_later.discard(key)

    executor.submit(run)


def parse_checked(expression: str, *, kinds: Callable[[Any, str], str]) -> tuple[Any, DeviceReads, Program]:
    """Parse, type-check (``kinds(tree, text)`` raises for a wrong result type), analyse and compile
    an expression of the DRA environment."""
    if not expression or not expression.strip():
        raise CelCompileError("CEL expression empty")
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(f"expression too long ({size} bytes, maximum is {MAX_EXPRESSION_LENGTH})")
    try:
        tree = parse(expression)
        kinds(tree, expression)
        reads = analyse(tree)
        program = compile_program(tree)
    except RecursionError:
        raise CelCompileError("compilation failed: expression nested too deeply") from None
    except ValueError as exc:
        if isinstance(exc, CelCompileError):
            raise
        raise CelCompileError(f"compilation failed: {exc}") from None
    return tree, reads, program


def _compile(expression: str) -> CompiledSelector:
    _, reads, program = parse_checked(expression, kinds=check)
    return CompiledSelector(expression=expression, program=program, reads=reads)
