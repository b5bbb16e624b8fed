"""The simulated node's `nvidia-smi` and MPS client: what a container has of the real driver.

On hardware, NVIDIA's CDI spec bind-mounts the driver's tools and libraries, so `nvidia-smi -L` in a
container lists the GPUs it was given. A simulated node has no driver, so the agent writes a small
POSIX shell stand-in (busybox runs it) and a table of the node's GPUs and MIG devices, and the CDI
specs of a simulated GPU claim mount both, read-only. It answers `-L` only, in the real tool's
format, from the device nodes the container was given (as the real one sees only those); anything
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

from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, Mount

CONTAINER_TOOL = "/usr/bin/nvidia-smi"
CONTAINER_TABLE = "/usr/share/accel-dra/nvidia-smi.table"
CONTAINER_MPS_CLIENT = "/usr/bin/mps-client"

MPS_CLIENT = """#!/bin/sh
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

SCRIPT = f"""#!/bin/sh
# nvidia-smi stand-in on a simulated node (accel-dra). Like the real tool in a container, -L lists
# the GPUs whose device nodes the container has, each with the MIG devices it was given.
table={CONTAINER_TABLE}
case "$1" in
  -L|--list-gpus) ;;
  *) echo "nvidia-smi (simulated by accel-dra): only -L is implemented" >&2; exit 2 ;;
esac
present() {{
  for node in $1; do [ -e "$node" ] || return 1; done
}}
n=0
while IFS='|' read -r uuid kind name parent nodes; do
  [ "$kind" = gpu ] || continue
  present "$nodes" || continue
  echo "GPU $n: $name (UUID: $uuid)"
  m=0
  while IFS='|' read -r muuid mkind mname mparent mnodes; do
    if [ "$mkind" = mig ] && [ "$mparent" = "$uuid" ] && present "$mnodes"; then
      echo "  MIG $mname Device $m: (UUID: $muuid)"
      m=$((m + 1))
    fi
  done < "$table"
  n=$((n + 1))
done < "$table"
if [ "$n" = 0 ]; then
  echo "No devices were found"
  exit 6
fi
"""


def _text(device: DiscoveredDevice, key: str) -> str:
    attribute = device.attributes.get(key)
    return str(attribute.value) if attribute is not None else ""


def table(devices: Sequence[DiscoveredDevice]) -> str:
    """One line per device, ``uuid|kind|name|parent uuid|device nodes``: a GPU's product name and
    its /dev/nvidiaN; a MIG device's profile, parent and capability nodes. A GPU in MIG mode is not
    published itself, so its row comes from its MIG devices."""
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
            migs.append(f"{device.uuid}|mig|{_text(device, 'profile')}|{device.parent_uuid}|{caps}")
    return "".join(line + "\n" for line in [*gpus.values(), *migs])


def install(root: Path, devices: Sequence[DiscoveredDevice]) -> ContainerEdits:
    """Write the stand-in and the table under ``root`` (blocking I/O); the mounts that inject them."""
    tool = root / "usr" / "bin" / "nvidia-smi"
    data = root / "usr" / "share" / "accel-dra" / "nvidia-smi.table"
    client = root / "usr" / "bin" / "mps-client"
    files = ((tool, SCRIPT, 0o755), (data, table(devices), 0o644), (client, MPS_CLIENT, 0o755))
    for path, content, mode in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
        path.chmod(mode)
    return ContainerEdits(
        mounts=(
            Mount(host_path=str(tool), container_path=CONTAINER_TOOL),
            Mount(host_path=str(data), container_path=CONTAINER_TABLE),
            Mount(host_path=str(client), container_path=CONTAINER_MPS_CLIENT),
        )
    )
