"""Moving a PCI function from one kernel driver to another through sysfs, as the kernel documents
it and NVIDIA's go-nvlib does: ``driver_override`` names the only driver that may take the
function, its current driver's ``unbind`` lets it go, the new driver's ``bind`` takes it.

Each write is one step; a crash between two leaves the function in a state the next call reads
and goes on from (``driver`` says where it is). Every method blocks: call it in a thread.

``written`` is called after each write with the file and the text. On a host it is None (the
kernel acts on the write itself); the simulated hardware passes its fake kernel, which does to the
fake sysfs tree what the kernel would (``simulated.fakekernel``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

from dra_node_agent.pci import bound_driver, pci_device_dir, valid_address

SysfsWritten = Callable[[Path, str], None]

# What sysfs shows in driver_override when none is set.
NO_OVERRIDE: Final = "(null)"
_DRIVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class BindingError(OSError):
    """A sysfs step that the kernel refused, or a name that cannot be a driver or an address."""


class PciDriverBinding:
    """The driver binding of PCI functions under ``sysfs_root``."""

    def __init__(self, sysfs_root: Path, *, written: SysfsWritten | None = None) -> None:
        self.sysfs_root = sysfs_root
        self._written = written

    def driver(self, address: str) -> str | None:
        """The driver holding the function now; None when it has none."""
        return bound_driver(self.sysfs_root, self._checked(address))

    def driver_loaded(self, driver: str) -> bool:
        return (self._driver_dir(driver) / "bind").exists()

    def override(self, address: str) -> str | None:
        """The function's driver_override; None when unset."""
        try:
            text = (pci_device_dir(self.sysfs_root, self._checked(address)) / "driver_override").read_text()
        except FileNotFoundError:
            return None
        value = text.strip()
        return None if value in ("", NO_OVERRIDE) else value

    def set_override(self, address: str, driver: str | None) -> None:
        """Only ``driver`` may take the function from now on (None: any driver that matches it)."""
        path = pci_device_dir(self.sysfs_root, self._checked(address)) / "driver_override"
        # A newline clears it: the kernel strips one, and an empty write is refused by some kernels.
        self._write(path, "\n" if driver is None else self._checked_driver(driver))

    def unbind(self, address: str) -> None:
        """Let the function go from the driver that holds it; nothing to do without one."""
        current = self.driver(address)
        if current is not None:
            self._write(self._driver_dir(current) / "unbind", address)

    def bind(self, address: str, driver: str) -> None:
        """Have ``driver`` take the function (its driver_override must allow it, and it must have
        none); the kernel refuses otherwise."""
        self._write(self._driver_dir(self._checked_driver(driver)) / "bind", self._checked(address))

    def _driver_dir(self, driver: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "drivers" / self._checked_driver(driver)

    def _write(self, path: Path, text: str) -> None:
        # O_TRUNC without O_CREAT: a sysfs attribute exists or the step is wrong; never make a file.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except OSError as exc:
            raise BindingError(exc.errno, f"{path}: {exc.strerror}") from exc
        try:
            os.write(fd, text.encode())
            if self._written is not None:
                self._written(path, text)  # the simulated kernel refuses as the real one would
        except OSError as exc:
            raise BindingError(exc.errno, f"writing {text.strip()!r} to {path}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    @staticmethod
    def _checked(address: str) -> str:
        if not valid_address(address):
            raise BindingError(0, f"{address!r} is not a PCI address (dddd:bb:dd.f)")
        return address

    @staticmethod
    def _checked_driver(driver: str) -> str:
        if not _DRIVER_NAME.fullmatch(driver):
            raise BindingError(0, f"{driver!r} is not a kernel driver name")
        return driver
