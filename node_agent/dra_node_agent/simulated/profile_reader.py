"""Strict reading of simulated hardware profiles (YAML): each field checked, each message naming the
profile and the field."""

from __future__ import annotations

from typing import Any


class ProfileError(ValueError):
    """A simulated-hardware profile that does not follow the schema."""


class Reader:
    """Strict YAML field reading with messages that name the profile and the field."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, where: str, message: str) -> ProfileError:
        return ProfileError(f"profile {self.label}: {where or 'top level'}: {message}")

    def mapping(self, value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "must be a mapping")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(where, f"unknown field {unknown[0]!r}")
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, "must be a string")
        return value

    def integer(self, value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(where, "must be an integer")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, "must be true or false")
        return value

    def sequence(self, value: Any, where: str, length: int | None = None) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, "must be a list")
        if length is not None and len(value) != length:
            raise self.fail(where, f"must have {length} entries, has {len(value)}")
        return value
