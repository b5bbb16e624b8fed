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

# The simulated node's nvidia-cuda-mps-control, installed under the simulated driver root.
#
# With -f it is the daemon (-f -M: multi-user): it creates the control FIFO, records the commands the
# agent sends it in the pipe folder's "settings" file and exits on "quit". It also serves the
# claim's clients (the container-side stand-in, ``container_tools``'s mps-client), modelling what
# matters of the real daemon:
# - one server at a time serves one user: a client of another user is refused while that server
#   has clients (the real daemon queues it until the server exits), unless the daemon is multi-user;
# - the server shares memory with its clients in /dev/shm: it creates a segment there, as root, in
#   a folder the claim's containers write too, so it never follows a link (rm, then an exclusive
#   create: a planted name makes it go without, it never writes through it);
# - a client's work grows the server's host memory ("host-memory <MiB>"), which the daemon's cgroup
#   holds to its limit.
# Answers go to the pipe folder's answers/ (read-only in containers), at most 64 kept. Without -f
# it is the client the agent sends commands through: it passes its input lines to the daemon and,
# like the real client, returns only once the daemon has acted on them.
SIMULATED_MPS_CONTROL: Final = """#!/bin/sh
# nvidia-cuda-mps-control on a simulated node (accel-dra).
set -f
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = -f ]; then
  multi=no; [ "$2" = -M ] && multi=yes
  [ -n "$CUDA_VISIBLE_DEVICES" ] || { echo "no GPUs (CUDA_VISIBLE_DEVICES is empty)" >&2; exit 1; }
  rm -f "$pipe/control"
  rm -rf "$pipe/answers"; mkdir -m 0755 "$pipe/answers" || exit 1
  echo "devices $CUDA_VISIBLE_DEVICES" > "$pipe/settings"
  echo "multi-user $multi" > "$pipe/mode"
  mkfifo -m 0622 "$pipe/control" || exit 1
  echo "MPS control daemon (simulated) serving $CUDA_VISIBLE_DEVICES (multi-user: $multi)"
  trap 'rm -f "$pipe/control"; exit 0' TERM INT
  me=$(id -u); server=""; clients=0; hog=""
  answer() {
    set -- "$pipe/answers/$1" "$2"
    printf '%s\n' "$2" > "$1.tmp" && mv -f "$1.tmp" "$1"
    set -- "$pipe"/answers/*
    [ $# -le 64 ] || rm -f "$1"
  }
  segment() {
    seg="accel-dra-mps-server-$server"
    [ -f "/dev/shm/$seg" ] && [ ! -L "/dev/shm/$seg" ] && return
    rm -f "/dev/shm/$seg"
    ( set -C; echo "$CUDA_VISIBLE_DEVICES" > "/dev/shm/$seg" ) 2>/dev/null || seg=none
  }
  connect() {
    if [ "$multi" = yes ] || [ -z "$server" ] || [ "$server" = "$1" ]; then
      if [ "$multi" = yes ]; then server=$me; else server=$1; fi
      clients=$((clients + 1)); segment
      answer "$2.connect" \\
        "served by the MPS server of user $server (client user $1, multi-user $multi) shm $seg"
    else
      answer "$2.connect" "refused: the MPS server of user $server serves other clients; \\
user $1 waits until it exits (the daemon is not multi-user)"
    fi
  }
  disconnect() {
    [ "$clients" -gt 0 ] && clients=$((clients - 1))
    rm -f "$pipe/answers/$2.connect" "$pipe/answers/$2.memory"
    if [ "$clients" = 0 ] && [ "$multi" = no ]; then
      rm -f "/dev/shm/accel-dra-mps-server-$server"; server=""
    fi
  }
  host_memory() {
    case "$2" in ''|*[!0-9]*) return ;; esac
    [ ${#2} -le 6 ] || return
    hog=$(head -c 1048576 /dev/zero | tr '\\0' m); size=1
    while [ "$size" -lt "$2" ]; do hog="$hog$hog"; size=$((size * 2)); done
    answer "$1.memory" "the MPS server holds $size MiB of host memory for it"
  }
  while true; do
    while read -r line; do
      set -- $line
      case "$1" in
        quit) rm -f "$pipe/control"; echo "quit"; exit 0 ;;
        set_default_active_thread_percentage|set_default_device_pinned_mem_limit)
          echo "$line" >> "$pipe/settings" ;;
        connect|disconnect|host-memory)
          # Client input: a numeric user and a nonce of hex digits and dashes, nothing else.
          case "$2$3" in *[!0-9a-f-]*) continue ;; esac
          [ -n "$2" ] && [ -n "$3" ] && [ ${#3} -le 64 ] || continue
          case "$1" in
            connect) case "$2" in *[!0-9]*) continue ;; esac; connect "$2" "$3" ;;
            disconnect) disconnect "$2" "$3" ;;
            host-memory) host_memory "$2" "$3" ;;
          esac ;;
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


# The simulated IMEX tools, under the simulated driver root where a real driver keeps nvidia-imex and
# nvidia-imex-ctl. A ComputeDomain daemon's claim mounts them into the daemon's container, as the
# driver's files (``nvidia.driver_files``); host-managed IMEX runs the control tool on the host.
#
# nvidia-imex -c CONFIG: reads the config's nodes file and command address, and answers as a real
# daemon would be: READY once its own address is among the nodes file's names in /etc/hosts (the
# daemon wrapper writes them as the domain's daemons join), re-read on SIGUSR1. It keeps its state
# next to the config (.imex-state, .imex-pid). Faults, in the node's IMEX fault folder (mounted
# read-only in the container): "fail-start" makes it exit at once, "not-ready" keeps it unready.
# Outside a container (unit tests) COMPUTE_DOMAIN_DAEMON_HOSTS_FILE, the wrapper's own variable,
# names the hosts file, and ACCEL_DRA_SIMULATED_IMEX_FAULTS the fault folder.
IMEX_FAULTS: Final = "imex"
IMEX_FAULTS_MOUNT: Final = "/run/accel-dra-simulated-imex"
SIMULATED_IMEX: Final = f"""#!/bin/sh
# nvidia-imex on a simulated node (accel-dra).
# SIGUSR1 is ignored until its handler is in place (a shell dies of it by default): the first
# resolve, after the handler, reads the hosts file as it is by then.
trap '' USR1
set -f
cfg=""
while [ $# -gt 0 ]; do
  case "$1" in -c) cfg="$2"; shift 2 ;; *) shift ;; esac
done
[ -n "$cfg" ] && [ -f "$cfg" ] || {{ echo "nvidia-imex: no config file (-c)" >&2; exit 1; }}
faults="${{ACCEL_DRA_SIMULATED_IMEX_FAULTS:-{IMEX_FAULTS_MOUNT}}}"
hosts="${{COMPUTE_DOMAIN_DAEMON_HOSTS_FILE:-/etc/hosts}}"
[ -e "$faults/fail-start" ] && {{ echo "nvidia-imex: failed to start (simulated fault)" >&2; exit 1; }}
dir=$(dirname "$cfg")
nodes=$(sed -n 's/^IMEX_NODE_CONFIG_FILE=//p' "$cfg")
bind=$(sed -n 's/^IMEX_CMD_BIND_INTERFACE_IP=//p' "$cfg")
resolve() {{
  peers=""; ready=no
  while read -r name; do
    [ -n "$name" ] || continue
    while read -r ip host rest; do
      [ "$host" = "$name" ] || continue
      peers="$peers $name=$ip"
      [ "$ip" = "$bind" ] && ready=yes
    done < "$hosts"
  done < "$nodes"
  [ -e "$faults/not-ready" ] && ready=no
  printf 'ready %s\\npeers%s\\n' "$ready" "$peers" > "$dir/.imex-state.tmp"
  mv -f "$dir/.imex-state.tmp" "$dir/.imex-state"
  echo "nvidia-imex (simulated): ready=$ready peers:$peers"
}}
trap resolve USR1
trap 'rm -f "$dir/.imex-state" "$dir/.imex-pid"; exit 0' TERM INT
echo $$ > "$dir/.imex-pid"
echo "nvidia-imex (simulated): command service on $bind:50005, nodes from $nodes"
resolve
while true; do sleep 1 & wait $!; done
"""

# nvidia-imex-ctl -c CONFIG -q: READY when the config's daemon runs and is ready, else UNAVAILABLE
# (exit 1). With --u=SOCKET (host-managed IMEX): READY when the host daemon's socket exists.
SIMULATED_IMEX_CTL: Final = """#!/bin/sh
# nvidia-imex-ctl on a simulated node (accel-dra).
set -f
cfg=/etc/nvidia-imex/config.cfg; socket=""
while [ $# -gt 0 ]; do
  case "$1" in
    -c) cfg="$2"; shift 2 ;;
    --u=*) socket="${1#--u=}"; shift ;;
    *) shift ;;
  esac
done
if [ -n "$socket" ]; then
  [ -e "$socket" ] && { echo READY; exit 0; }
  echo UNAVAILABLE; exit 1
fi
dir=$(dirname "$cfg")
pid=$(cat "$dir/.imex-pid" 2>/dev/null)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -qx 'ready yes' "$dir/.imex-state" 2>/dev/null; then
  echo READY; exit 0
fi
echo UNAVAILABLE; exit 1
"""


def install_simulated_imex(driver_root: Path) -> None:
    """Write the simulated node's nvidia-imex and nvidia-imex-ctl under ``driver_root`` (blocking)."""
    for name, script in (("nvidia-imex", SIMULATED_IMEX), ("nvidia-imex-ctl", SIMULATED_IMEX_CTL)):
        path = driver_root / "usr" / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != script:
            path.write_text(script)
        path.chmod(0o755)
