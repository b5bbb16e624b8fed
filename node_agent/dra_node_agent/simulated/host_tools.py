"""Stand-ins for the host driver's tools on a simulated node, under its simulated driver root.

A simulated node has no NVIDIA driver, yet time-slicing and MPS run the same code as on hardware:
they call the driver root's ``nvidia-smi`` and ``nvidia-cuda-mps-control``. These POSIX shell
stand-ins take their place and keep what they were told in the simulated hardware's state folder,
where a test can read it. This is the MPS one; ``nvidia-smi``, which containers run too, is in
``container_tools`` with the rest of the simulated driver root.
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
