"""Stand-ins for the host driver's tools on a simulated node, under its simulated driver root.

A simulated node has no NVIDIA driver, yet time-slicing and MPS run the same code as on hardware:
they call the driver root's ``nvidia-smi`` and ``nvidia-cuda-mps-control``. These POSIX shell
stand-ins take their place and keep what they were told in the simulated hardware's state folder,
where a test can read it. (The container-side ``nvidia-smi -L`` stand-in is ``container_tools``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

# The simulated node's nvidia-cuda-mps-control, installed under the simulated driver root. With -f
# it is the daemon: it creates the control FIFO, marks the shm it was given (so a test sees that its
# containers share it), records the commands it receives in the pipe folder's "settings" file and
# exits on "quit". Without -f it is the client: it passes its input lines to the daemon and, like the
# real client, returns only once the daemon has acted on them.
SIMULATED_MPS_CONTROL: Final = """#!/bin/sh
# nvidia-cuda-mps-control on a simulated node (accel-dra).
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = -f ]; then
  [ -n "$CUDA_VISIBLE_DEVICES" ] || { echo "no GPUs (CUDA_VISIBLE_DEVICES is empty)" >&2; exit 1; }
  rm -f "$pipe/control"
  echo "$CUDA_VISIBLE_DEVICES" > /dev/shm/accel-dra-mps-daemon
  echo "devices $CUDA_VISIBLE_DEVICES" > "$pipe/settings"
  mkfifo -m 0666 "$pipe/control" || exit 1
  echo "MPS control daemon (simulated) serving $CUDA_VISIBLE_DEVICES"
  trap 'rm -f "$pipe/control"; exit 0' TERM INT
  while true; do
    while read -r line; do
      case "$line" in
        quit) rm -f "$pipe/control"; echo "quit"; exit 0 ;;
        set_default_active_thread_percentage\\ *|set_default_device_pinned_mem_limit\\ *)
          echo "$line" >> "$pipe/settings" ;;
        *) echo "unknown command: $line" >> "$pipe/settings" ;;
      esac
    done < "$pipe/control"
  done
fi
[ -p "$pipe/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
input=$(cat)
want=$(( $(wc -l < "$pipe/settings") + $(printf '%s\n' "$input" | grep -v '^quit$' | grep -c .) ))
printf '%s\n' "$input" > "$pipe/control"
# The real client returns once the daemon has answered: wait until each command is recorded (and,
# after quit, until the daemon has removed its FIFO), for at most 5 s.
tries=0
while [ "$(wc -l < "$pipe/settings")" -lt "$want" ] ||
  { printf '%s\n' "$input" | grep -qx quit && [ -p "$pipe/control" ]; }; do
  tries=$((tries + 1))
  [ "$tries" -le 500 ] || { echo "the MPS control daemon did not answer" >&2; exit 1; }
  sleep 0.01
done
"""


def install_simulated_mps_control(path: Path) -> None:
    """Write the simulated node's nvidia-cuda-mps-control at ``path`` (blocking)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != SIMULATED_MPS_CONTROL:
        path.write_text(SIMULATED_MPS_CONTROL)
    path.chmod(0o755)


# The simulated host's nvidia-smi: the two compute settings the agent changes, kept per GPU in the
# fake NVML's state folder (STATE is substituted). Anything else exits 2, as for the container's
# stand-in (``container_tools``).
SIMULATED_NVIDIA_SMI: Final = """#!/bin/sh
# nvidia-smi on a simulated node's host (accel-dra): compute-policy --set-timeslice only.
state=@STATE@
if [ "$1" != compute-policy ]; then
  echo "nvidia-smi (simulated by accel-dra): only compute-policy -i IDS --set-timeslice N" >&2
  exit 2
fi
shift
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
"""


def install_simulated_nvidia_smi(path: Path, state_dir: Path) -> None:
    """Write the simulated host's nvidia-smi at ``path`` (blocking)."""
    content = SIMULATED_NVIDIA_SMI.replace("@STATE@", _shell_quote(str(state_dir)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != content:
        path.write_text(content)
    path.chmod(0o755)


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
