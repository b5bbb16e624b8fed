"""Errors raised by the DRA CEL environment."""

from __future__ import annotations

__all__ = ["CelCompileError", "CelRuntimeError"]


class CelCompileError(ValueError):
    """A selector that cannot be compiled: syntax, undeclared names, types, or too long."""


class CelRuntimeError(RuntimeError):
    """A selector whose evaluation failed for a device (missing attribute, bad argument, non-bool)."""
