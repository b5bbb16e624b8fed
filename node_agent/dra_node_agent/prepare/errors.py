"""How a claim's prepare fails when the claim or its config is at fault."""

from __future__ import annotations


class PrepareError(Exception):
    """A claim that cannot be prepared; the message names the claim and the reason."""
