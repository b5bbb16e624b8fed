"""The simulated node's driver root and MPS client: what a GPU claim's CDI spec mounts, as from a real driver.

On hardware the claim's spec mounts the driver's libraries and tools from the driver root
(``nvidia.driver_files``), so ``nvidia-smi -L`` in a container lists the GPUs it was given. A
simulated node has no driver, so its driver root holds stand-ins the same scan finds and the same
spec mounts: placeholder files named as the driver's libraries (``libcuda.so.<version>`` with its
``libcuda.so.1`` and ``libcuda.so`` links, ``libnvidia-ml.so.<version>``), a GSP firmware file, and
``usr/bin/nvidia-smi``, a POSIX shell script (busybox runs it in a container).

The one ``nvidia-smi`` serves both sides, as the real one does. On the host the agent runs
``compute-policy -i IDS --set-timeslice N`` (time-slicing), kept per GPU in the fake NVML's state
folder. In a container ``-L`` lists, in the real tool's format, the GPUs and MIG devices whose
device nodes the container has (the real tool sees only those), from the table of the node's
devices at the end of the script (lines ``#@uuid|kind|name|parent uuid|device nodes``). Anything
else exits 2 and says so.

`mps-client` stands in for a CUDA process of an MPS claim: it connects to the claim's daemon (the
host stand-in, ``host_tools``) through CUDA_MPS_PIPE_DIRECTORY as the container's user, says which
server serves it and whether its /dev/shm is the server's, and then holds its connection for the
seconds asked (`mps-client hold N`) or has the server take host memory for it
(`mps-client host-memory MiB`). Exit status 1 when it is not served.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, Mount

NVIDIA_SMI: Final = "usr/bin/nvidia-smi"
LIBRARY_DIR: Final = "usr/lib/x86_64-linux-gnu"
# The libraries a CUDA container loads first: (name, SONAME, development link or "").
LIBRARIES: Final = (
    ("libcuda.so", "libcuda.so.1", "libcuda.so"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1", ""),
)
GSP_FIRMWARE: Final = "gsp_ga10x.bin"
TABLE_MARK: Final = "#@"
CONTAINER_MPS_CLIENT: Final = "/usr/bin/mps-client"
MPS_CLIENT_PATH: Final = "usr/bin/mps-client"

MPS_CLIENT: Final = """#!/bin/sh
# A CUDA client of the claim's MPS daemon on a simulated node (accel-dra).
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
say() { echo "mps-client: $*"; }
[ -p "$pipe/control" ] || { say "no MPS control daemon at $pipe"; exit 1; }
id=$(cat /proc/sys/kernel/random/uuid); uid=$(id -u)
send() {
  timeout 5 sh -c 'printf "%s\\n" "$1" > "$2"' send "$1" "$pipe/control" ||
    { say "the MPS control daemon does not read its pipe"; exit 1; }
}
await() {
  i=0
  while [ ! -f "$pipe/answers/$id.$1" ]; do
    i=$((i + 1)); [ "$i" -le 100 ] || { echo "no answer from the MPS control daemon"; return 1; }
    sleep 0.1
  done
  cat "$pipe/answers/$id.$1"
}
send "connect $uid $id"; answer=$(await connect); status=$?; say "$answer"
[ "$status" = 0 ] || exit 1
case "$answer" in served*) ;; *) exit 1 ;; esac
seg=${answer##* shm }
if [ -f "/dev/shm/$seg" ]; then say "/dev/shm is the server's: $(cat "/dev/shm/$seg")"
else say "/dev/shm is not the server's"; fi
case "$1" in
  hold) trap 'send "disconnect $uid $id"; exit 0' TERM INT; sleep "${2:-3600}" & wait $! ;;
  host-memory)
    send "host-memory $id ${2:-1}"; answer=$(await memory); status=$?; say "$answer"
    [ "$status" = 0 ] || exit 1 ;;
esac
send "disconnect $uid $id"
"""

_SCRIPT: Final = """#!/bin/sh
# nvidia-smi on a simulated node (accel-dra), under its simulated driver root. On the host:
# compute-policy -i IDS --set-timeslice N. In a container given it by a claim's CDI spec: -L.
state=@STATE@
list_gpus() {
  present() {
    for node in $1; do [ -e "$node" ] || return 1; done
  }
  n=0
  while IFS='|' read -r uuid kind name parent nodes; do
    case "$uuid" in "@TABLE_MARK@"*) uuid=${uuid#"@TABLE_MARK@"} ;; *) continue ;; esac
    [ "$kind" = gpu ] || continue
    present "$nodes" || continue
    echo "GPU $n: $name (UUID: $uuid)"
    m=0
    while IFS='|' read -r muuid mkind mname mparent mnodes; do
      case "$muuid" in "@TABLE_MARK@"?*) muuid=${muuid#"@TABLE_MARK@"} ;; *) continue ;; esac
      if [ "$mkind" = mig ] && [ "$mparent" = "$uuid" ] && present "$mnodes"; then
        echo "  MIG $mname Device $m: (UUID: $muuid)"
        m=$((m + 1))
      fi
    done < "$0"
    n=$((n + 1))
  done < "$0"
  if [ "$n" = 0 ]; then
    echo "No devices were found"
    exit 6
  fi
}
set_time_slice() {
  ids=""; value=""
  while [ $# -gt 0 ]; do
    case "$1" in
      -i|--id) ids="$2"; shift 2 ;;
      --set-timeslice) value="$2"; shift 2 ;;
      --set-timeslice=*) value="${1#--set-timeslice=}"; shift ;;
      *) echo "Invalid combination of input arguments: $1" >&2; exit 2 ;;
    esac
  done
  case "$value" in
    0|1|2|3) ;;
    *) echo "Invalid timeslice value: '$value' (0 Default, 1 Short, 2 Medium, 3 Long)" >&2; exit 2 ;;
  esac
  [ -n "$ids" ] || { echo "compute-policy needs -i" >&2; exit 2; }
  for id in $(echo "$ids" | tr ',' ' '); do
    [ -d "$state/$id" ] || { echo "No GPU with UUID $id was found" >&2; exit 6; }
  done
  for id in $(echo "$ids" | tr ',' ' '); do
    echo "$value" > "$state/$id/timeslice"
    echo "Set timeslice to $value for GPU $id"
  done
}
case "$1" in
  -L|--list-gpus) list_gpus ;;
  compute-policy) shift; set_time_slice "$@" ;;
  *)
    echo "nvidia-smi (simulated by accel-dra): only -L, and compute-policy -i IDS --set-timeslice N" >&2
    exit 2
    ;;
esac
exit 0
# The node's GPUs and MIG devices:
"""


def _text(device: DiscoveredDevice, key: str) -> str:
    attribute = device.attributes.get(key)
    return str(attribute.value) if attribute is not None else ""


def table(devices: Sequence[DiscoveredDevice]) -> str:
    """One line per device, ``uuid|kind|name|parent uuid|device nodes``: a GPU's product name and
    its /dev/nvidiaN; a MIG device's profile, parent and capability nodes. A GPU in MIG mode is not
    published itself, so its row comes from its MIG devices; a dynamic MIG placement, which has no
    UUID before a claim makes it, has no row."""
    gpus: dict[str, str] = {}
    migs: list[str] = []
    for device in devices:
        nodes = [n.path for n in device.edits.device_nodes]
        if device.kind == "gpu":
            gpus[device.uuid] = f"{device.uuid}|gpu|{_text(device, 'productName')}||{' '.join(nodes)}"
        elif device.kind == "mig" and device.parent_uuid:
            caps = " ".join(n for n in nodes if "/nvidia-caps/" in n)
            parent_nodes = " ".join(n for n in nodes if "/nvidia-caps/" not in n and n[-1].isdigit())
            gpus.setdefault(
                device.parent_uuid,
                f"{device.parent_uuid}|gpu|{_text(device, 'productName')}||{parent_nodes}",
            )
            if device.uuid:
                migs.append(f"{device.uuid}|mig|{_text(device, 'profile')}|{device.parent_uuid}|{caps}")
    return "".join(line + "\n" for line in [*gpus.values(), *migs])


def nvidia_smi_script(*, state_dir: Path, devices: Sequence[DiscoveredDevice] = ()) -> str:
    """The stand-in's text: the GPUs' settings under ``state_dir``, the table of ``devices``."""
    head = _SCRIPT.replace("@STATE@", _shell_quote(str(state_dir))).replace("@TABLE_MARK@", TABLE_MARK)
    return head + "".join(TABLE_MARK + line + "\n" for line in table(devices).splitlines())


def write_nvidia_smi(driver_root: Path, *, state_dir: Path, devices: Sequence[DiscoveredDevice] = ()) -> None:
    """Write the stand-in under ``driver_root`` when its text changed (blocking). In place, so that
    containers which have it mounted see the new table."""
    _write(driver_root / NVIDIA_SMI, nvidia_smi_script(state_dir=state_dir, devices=devices), 0o755)


def install_driver_files(driver_root: Path, *, version: str) -> None:
    """The driver's libraries (placeholders, with their links) and GSP firmware (blocking)."""
    libraries = driver_root / LIBRARY_DIR
    libraries.mkdir(parents=True, exist_ok=True)
    for name, soname, dev_link in LIBRARIES:
        versioned = f"{name}.{version}"
        _write(libraries / versioned, f"simulated {versioned} (accel-dra): not a loadable library\n", 0o644)
        _link(libraries / soname, versioned)
        if dev_link:
            _link(libraries / dev_link, soname)
    firmware = driver_root / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    _write(firmware / GSP_FIRMWARE, "simulated GSP firmware (accel-dra)\n", 0o644)


def _write(path: Path, content: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != content:
        path.write_text(content)
    path.chmod(mode)


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and str(path.readlink()) == target:
        return
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def install_mps_client(driver_root: Path) -> ContainerEdits:
    """Write `mps-client` under ``driver_root`` (blocking); the mount that gives it to containers."""
    client = driver_root / MPS_CLIENT_PATH
    _write(client, MPS_CLIENT, 0o755)
    return ContainerEdits(mounts=(Mount(host_path=str(client), container_path=CONTAINER_MPS_CLIENT),))
