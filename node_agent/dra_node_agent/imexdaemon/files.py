"""The files the daemon writes (blocking; the supervisor calls them in a thread): the rendered IMEX
config, the nodes file, and the clique's DNS names in the hosts file."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from dra_node_agent.nvidia import imex_config

# Lines of the hosts file that name a daemon of the clique: the daemon owns these, nothing else.
_DAEMON_NAME: Final = re.compile(r"^compute-domain-daemon-\d{4}$")
MAX_HOSTS_BYTES: Final = 1 << 20


class FilesError(Exception):
    """A file could not be read or written; the message names it."""


def write_config(
    *, template_file: str, config_file: str, nodes_file: str, pod_ip: str, max_nodes: int
) -> None:
    """Render imexd.cfg from the agent's template and write the static nodes file."""
    try:
        template = Path(template_file).read_text()
    except OSError as exc:
        raise FilesError(f"reading the IMEX config template {template_file}: {exc.strerror}") from None
    _replace(Path(nodes_file), imex_config.nodes_file(max_nodes))
    _replace(Path(config_file), imex_config.render(template, pod_ip=pod_ip, nodes_file=nodes_file))


def address_map(daemons: Iterable[Mapping[str, Any]], *, max_nodes: int) -> dict[str, str]:
    """DNS name -> IP address of the clique's daemons; entries with a bad index or address are left
    out (the clique is written by daemons, yet nothing but an address reaches the hosts file)."""
    mapping: dict[str, str] = {}
    for daemon in daemons:
        index, ip = daemon.get("index"), daemon.get("ipAddress")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < max_nodes:
            continue
        try:
            address = ipaddress.ip_address(str(ip))
        except ValueError:
            continue
        mapping[imex_config.dns_name(index)] = str(address)
    return dict(sorted(mapping.items()))


def hosts_text(current: str, mapping: Mapping[str, str]) -> str:
    """``current`` without its daemon lines, then one line per daemon of ``mapping``."""
    kept = [line for line in current.splitlines() if not _is_daemon_line(line)]
    return "".join(f"{line}\n" for line in kept) + "".join(f"{ip}\t{name}\n" for name, ip in mapping.items())


def update_hosts(path: str, mapping: Mapping[str, str]) -> bool:
    """Make the hosts file map the daemons' names as ``mapping`` says; whether it changed."""
    hosts = Path(path)
    try:
        with hosts.open("rb") as f:
            current = f.read(MAX_HOSTS_BYTES + 1)
    except FileNotFoundError:
        current = b""
    except OSError as exc:
        raise FilesError(f"reading {path}: {exc.strerror}") from None
    if len(current) > MAX_HOSTS_BYTES:
        raise FilesError(f"{path} is larger than {MAX_HOSTS_BYTES} bytes")
    text = current.decode(errors="replace")
    wanted = hosts_text(text, mapping)
    if wanted == text:
        return False
    _replace(hosts, wanted, in_place_if_busy=True)
    return True


def _is_daemon_line(line: str) -> bool:
    fields = line.split("#", 1)[0].split()
    return len(fields) >= 2 and any(_DAEMON_NAME.match(name) for name in fields[1:])


def _replace(path: Path, text: str, *, in_place_if_busy: bool = False) -> None:
    """Replace ``path`` by a rename, so readers see the old or the new file. A pod's /etc/hosts is
    a bind mount, which no rename can replace (EBUSY): that one is rewritten in one write."""
    data = text.encode()
    temp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(temp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
        return
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if not (in_place_if_busy and exc.errno in (errno.EBUSY, errno.EXDEV, errno.EACCES, errno.EROFS)):
            raise FilesError(f"writing {path}: {exc.strerror}") from None
    try:
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()
    except OSError as exc:
        raise FilesError(f"writing {path}: {exc.strerror}") from None
