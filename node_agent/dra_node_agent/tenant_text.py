"""Text a tenant wrote (a config key, a value), made safe for a log line, an Event or the error the
kubelet shows: control characters, newlines included, escaped so that it cannot start a line of its
own (a forged log line), and its length bounded. Pure."""

from __future__ import annotations

import json
import re
from typing import Final

MAX_SHOWN: Final = 64  # characters of one tenant string in a message
MAX_MESSAGE: Final = 4096  # characters of a whole error message handed to the kubelet
_PLAIN = re.compile(r"[A-Za-z0-9_.:/+-]{1,64}")
# C0 and C1 controls, DEL and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def quoted(value: object, *, limit: int = MAX_SHOWN) -> str:
    """``value`` as a JSON string literal (``"name"``, ``"a\\nb"``), cut to ``limit`` characters with
    ``...`` after; a value that is not a string is shown by its ``repr``."""
    text = value if isinstance(value, str) else repr(value)
    return json.dumps(text[:limit]) + ("..." if len(text) > limit else "")


def shown(value: object, *, limit: int = MAX_SHOWN) -> str:
    """``value`` unchanged when it is a plain word (letters, digits, ``_.:/+-``), else ``quoted``."""
    if isinstance(value, str) and _PLAIN.fullmatch(value) and len(value) <= limit:
        return value
    return quoted(value, limit=limit)


def one_line(text: str, *, limit: int = MAX_MESSAGE) -> str:
    """``text`` with every control character escaped (``\\n``, ``\\u2028``) and cut to ``limit``."""
    escaped = _CONTROL.sub(lambda m: json.dumps(m.group())[1:-1], text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."
