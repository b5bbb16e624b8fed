"""Kubernetes ``resource.Quantity``: exact values, parsing and canonical formatting.

Semantics follow ``k8s.io/apimachinery/pkg/api/resource``:

* a quantity is a signed decimal number with an optional suffix: binary (``Ki`` .. ``Ei``), decimal
  (``n u m k M G T P E``) or a decimal exponent (``e3``, ``E-2``);
* parsed values are rounded *up* (away from zero) to nano precision, so a tiny request never becomes 0;
* binary values are capped at 2^63-1 when parsed; a binary value between -1 and 1 is shown as decimal;
* the string form is canonical: the largest suffix that keeps the number an integer, in the format the
  quantity was written in (``1024Mi`` prints as ``1Gi``, ``1000Mi`` stays, ``0.5`` prints as ``500m``).

Values are kept as an integer number of nano-units, so arithmetic and comparison are exact.
"""

from __future__ import annotations

import enum
import fractions
import functools
from typing import Final

__all__ = ["Format", "Quantity", "is_on_step", "round_up_to_step"]

_NANO: Final = 10**9
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
# Decimal exponents outside this range cannot come from a sensible manifest; rejecting them keeps a
# hostile "1e999999999" from allocating an enormous integer.
_MAX_ABS_EXPONENT: Final = 1000

_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXPONENT: Final = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT: Final = {exp: suffix for suffix, exp in _BINARY_SUFFIXES.items()}
# Characters that may start a suffix, as upstream scans them.
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")


class Format(enum.Enum):
    """How a quantity was written, which decides how it is printed."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


def _format_error(text: str, why: str) -> ValueError:
    return ValueError(f"invalid quantity {text!r}: {why}")


def _split(text: str) -> tuple[bool, str, str, str]:
    """Split into (negative, integer digits, fraction digits, suffix) the way upstream scans."""
    pos = 0
    end = len(text)
    negative = False
    if text[0] in "+-":
        negative = text[0] == "-"
        pos = 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    whole = text[start:pos]
    frac = ""
    dot = False
    if pos < end and text[pos] == ".":
        dot = True
        pos += 1
        frac_start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        frac = text[frac_start:pos]
    if dot and not whole and not frac:
        raise _format_error(text, "the numeric part has no digits")
    if not whole and not frac and pos < end:
        raise _format_error(text, "expected a number before the suffix")
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos != end:
        raise _format_error(
            text, "must match '^([+-]?[0-9.]+)([eEinumkKMGTPE]*[-+]?[0-9]*)$' (unexpected character)"
        )
    return negative, whole, frac, text[suffix_start:]


def _interpret_suffix(text: str, suffix: str) -> tuple[int, int, Format]:
    """Return (base, exponent, format) for a suffix; base 2 exponents are bit shifts."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if body and all(c in _DIGITS for c in body):
            exponent = int(digits)
            if abs(exponent) > _MAX_ABS_EXPONENT:
                raise _format_error(text, f"exponent {exponent} is out of range")
            return 10, exponent, Format.DECIMAL_EXPONENT
    raise _format_error(text, f"unknown suffix {suffix!r}")


def _ceil_div(num: int, den: int) -> int:
    return -((-num) // den)


def _strip_factors(value: int, base: int) -> tuple[int, int]:
    """Remove factors of ``base`` from a non-zero integer; return (rest, how many removed)."""
    times = 0
    while value % base == 0:
        value //= base
        times += 1
    return value, times


@functools.total_ordering
class Quantity:
    """An immutable Kubernetes quantity; equality, ordering and hash go by exact value."""

    __slots__ = ("_format", "_nanos")

    _nanos: int
    _format: Format

    def __init__(self, *, nanos: int, format: Format = Format.DECIMAL_SI) -> None:
        object.__setattr__(self, "_nanos", nanos)
        object.__setattr__(self, "_format", format)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | int) -> Quantity:
        """Parse a quantity string (or an integer, as a decimal quantity); ValueError if malformed."""
        if isinstance(text, bool):
            raise ValueError(f"invalid quantity {text!r}: a bool is not a quantity")
        if isinstance(text, int):
            return cls.from_int(text)
        if not isinstance(text, str):
            raise ValueError(f"invalid quantity {text!r}: expected a string, got {type(text).__name__}")
        return _parse_cached(text)

    @classmethod
    def from_int(cls, value: int, *, format: Format = Format.DECIMAL_SI) -> Quantity:
        """A whole-number quantity (as ``resource.NewQuantity``)."""
        return cls(nanos=value * _NANO, format=format)

    @classmethod
    def from_fraction(
        cls,
        value: fractions.Fraction | int,
        *,
        format: Format = Format.DECIMAL_SI,
    ) -> Quantity:
        """An exact value, rounded up (away from zero) to nano precision as parsing does."""
        frac = fractions.Fraction(value)
        magnitude = _ceil_div(abs(frac.numerator) * _NANO, frac.denominator)
        return cls(nanos=-magnitude if frac < 0 else magnitude, format=format)

    # ---- value access -------------------------------------------------------------------------

    @property
    def value(self) -> fractions.Fraction:
        """The exact numeric value."""
        return fractions.Fraction(self._nanos, _NANO)

    @property
    def format(self) -> Format:
        return self._format

    @property
    def nanos(self) -> int:
        """The value in units of 10^-9 (always exact)."""
        return self._nanos

    def as_int(self) -> int | None:
        """The value as an int64, or None when it has a fraction or does not fit (as ``AsInt64``)."""
        whole, rest = divmod(self._nanos, _NANO)
        if rest or not _INT64_MIN <= whole <= _INT64_MAX:
            return None
        return whole

    def is_integer(self) -> bool:
        return self.as_int() is not None

    def sign(self) -> int:
        return (self._nanos > 0) - (self._nanos < 0)

    def is_zero(self) -> bool:
        return self._nanos == 0

    def as_approximate_float(self) -> float:
        return float(self.value)

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1 (as ``Quantity.Cmp``)."""
        return (self._nanos > other._nanos) - (self._nanos < other._nanos)

    # ---- arithmetic (format rules as upstream Add/Sub: keep ours unless we are zero) -------------

    def __add__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(nanos=self._nanos + other._nanos, format=fmt)

    def __sub__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(nanos=self._nanos - other._nanos, format=fmt)

    def __neg__(self) -> Quantity:
        return Quantity(nanos=-self._nanos, format=self._format)

    def __abs__(self) -> Quantity:
        return Quantity(nanos=abs(self._nanos), format=self._format)

    def __mul__(self, factor: int) -> Quantity:
        if not isinstance(factor, int) or isinstance(factor, bool):
            return NotImplemented
        return Quantity(nanos=self._nanos * factor, format=self._format)

    __rmul__ = __mul__

    # ---- comparison and hashing ---------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos == other._nanos

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos < other._nanos

    def __hash__(self) -> int:
        return hash(("Quantity", self._nanos))

    def __bool__(self) -> bool:
        return self._nanos != 0

    # ---- formatting ---------------------------------------------------------------------------

    def __str__(self) -> str:
        return _canonical(self._nanos, self._format)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def to_json(self) -> str:
        """The canonical string, as the API server serialises a quantity."""
        return str(self)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self._nanos, self._format.value))


def _rebuild(nanos: int, fmt: str) -> Quantity:
    return Quantity(nanos=nanos, format=Format(fmt))


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    if not text:
        raise _format_error(text, "empty string")
    negative, whole, frac, suffix = _split(text)
    base, exponent, fmt = _interpret_suffix(text, suffix)
    digits = int((whole or "0") + frac)
    # value = digits * 10^-len(frac) * base^exponent, in nano-units, rounded up in magnitude.
    if base == 2:
        num = digits * (1 << exponent) * _NANO
        den = 10 ** len(frac)
    else:
        shift = exponent + 9 - len(frac)
        if shift >= 0:
            num, den = digits * 10**shift, 1
        else:
            num, den = digits, 10**-shift
    magnitude = _ceil_div(num, den)
    if fmt is Format.BINARY_SI:
        # Upstream caps binary quantities at the int64 maximum.
        magnitude = min(magnitude, _INT64_MAX * _NANO)
        if 0 < magnitude < _NANO:
            fmt = Format.DECIMAL_SI
    return Quantity(nanos=-magnitude if negative else magnitude, format=fmt)


@functools.lru_cache(maxsize=4096)
def _canonical(nanos: int, fmt: Format) -> str:
    if nanos == 0:
        return "0"
    if fmt is Format.BINARY_SI:
        if -1024 * _NANO < nanos < 1024 * _NANO or nanos % _NANO:
            # Small or fractional binary values print as decimal so nothing is rounded.
            fmt = Format.DECIMAL_SI
        else:
            whole = nanos // _NANO
            rest, times = _strip_factors(abs(whole), 1024)
            times10 = times * 10
            while times10 > 60:
                # Beyond Ei there is no suffix: keep the factor in the number.
                rest *= 1024
                times10 -= 10
            sign = "-" if whole < 0 else ""
            return f"{sign}{rest}{_BINARY_BY_EXPONENT.get(times10, '')}"
    mantissa, times = _strip_factors(abs(nanos), 10)
    exponent = times - 9
    # Lower the exponent to a multiple of three, moving the factor into the mantissa.
    adjust = exponent % 3
    mantissa *= 10**adjust
    exponent -= adjust
    sign = "-" if nanos < 0 else ""
    if fmt is Format.DECIMAL_EXPONENT:
        return f"{sign}{mantissa}" if exponent == 0 else f"{sign}{mantissa}e{exponent}"
    if exponent > 18:
        mantissa *= 10 ** (exponent - 18)
        exponent = 18
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"


def round_up_to_step(*, value: Quantity, minimum: Quantity, step: Quantity | None) -> Quantity:
    """Round ``value`` up onto the grid ``minimum + k*step`` (never below ``minimum``).

    Exact: ``max(min, min + ceil((value - min) / step) * step)``; without a step the result is
    ``max(min, value)``. (The allocator fits consumable-capacity requests as Kubernetes does, in
    whole units or, with DRAFractionalCapacityRange, milli-units: ``dra_operator.allocator.capacity``.)
    """
    if value <= minimum:
        return minimum
    if step is None or step.is_zero():
        return value
    if step.sign() < 0:
        raise ValueError(f"capacity step {step} must be positive")
    steps = _ceil_div(value.nanos - minimum.nanos, step.nanos)
    return minimum + step * steps


def is_on_step(*, value: Quantity, minimum: Quantity, step: Quantity) -> bool:
    """Whether ``value`` lies on the grid ``minimum + k*step`` for some k >= 0."""
    if step.sign() <= 0:
        raise ValueError(f"capacity step {step} must be positive")
    diff = value.nanos - minimum.nanos
    return diff >= 0 and diff % step.nanos == 0
