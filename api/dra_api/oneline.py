"""Command lines whose errors are one line, for every program of the project.

argparse's own ``error`` prints the usage and then the message. Each command here answers a bad
argument in one line instead, naming ``--help``: a command that handles its errors itself (and
prints them its own way) sets ``error_class`` and gets the line raised as that exception; one that
does not gets ``<prog>: <message> (see '<prog> --help')`` on stderr and exit status 2. Subcommands'
parsers are made of the same class, so they answer the same way.
"""

from __future__ import annotations

import argparse
from typing import ClassVar, NoReturn

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    error_class: ClassVar[type[Exception] | None] = None
    """Raised with the one line when set; else the line is printed and the program exits 2."""
    hint: ClassVar[str] = " (see '{prog} --help')"
    """What follows the message."""
    program: ClassVar[str | None] = None
    """What the printed line starts with (default: the parser's prog, subcommand included)."""

    def error(self, message: str) -> NoReturn:
        text = message + self.hint.format(prog=self.prog)
        if self.error_class is not None:
            raise self.error_class(text)
        self.exit(2, f"{self.program or self.prog}: {text}\n")
