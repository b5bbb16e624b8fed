"""The single error type raised for malformed resource.k8s.io objects."""

from __future__ import annotations


class ModelError(ValueError):
    """Bad input: the message names the object (kind namespace/name) and the field path."""
