#!/usr/bin/env bash
# A device reached through ssh, on this machine: a loopback OpenSSH server and a
# "target venv" (torch, the reference backend and the project's runtime; no
# pytest, no Hypothesis, no compiler), for running the target half of the suite
# through `--backendconf-target-command`. Debian, as root (the server runs as
# root and logs in as root; it listens on 127.0.0.1 only).
#
#   devices/ssh-device.sh start DIR [PORT]   install openssh-server if missing, make per-session
#                                            keys in DIR, start sshd on 127.0.0.1:PORT (default: a
#                                            free port); prints the ssh command prefix, also kept in DIR/ssh-command
#   devices/ssh-device.sh drop DIR           cut every open connection (a disconnect: the clients' ssh
#                                            exits 255); the server goes on accepting new ones
#   devices/ssh-device.sh stop DIR           stop the sshd that `start DIR` started, and its connections
#   devices/ssh-device.sh venv DIR [PYTHON]  make the target venv in DIR (torch==$TORCH, default 2.13.0) and
#                                            DIR/bin/device-python; prints the latter
#
# DIR/bin/device-python is the Python to name after the ssh prefix. It appends a
# line to DIR/started.log (proof that a runner started on the "device") and runs
# the venv's python in a private mount namespace where $HIDE (default: /tmp and
# this checkout) are empty folders, so the device cannot read the host's files:
# loopback ssh shares them, and a path that leaked into a message would still
# work. DIR must lie outside $HIDE (e.g. ~/.cache/backendconf/target-venv). A
# checkout under /tmp is hidden with /tmp: its own mount is skipped (the folder
# is gone once /tmp is empty).
#
# Killing only the listening sshd leaves open connections running: each has
# its own sshd process, a child of the listener. `drop` and `stop` end those too.
#
# A device on the other end of the link then runs, for example:
#   $(cat DIR/ssh-command) /path/to/target-venv/bin/device-python -m pytest_backendconf.target._child
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
TORCH="${TORCH:-2.13.0}"

usage() { sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local dir="$1" port="${2:-}"
    [ -n "$dir" ] || usage
    mkdir -p "$dir" && dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/sshd.pid" ] && kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null; then
        echo "sshd already running from $dir (pid $(cat "$dir/sshd.pid")); stop it first: $0 stop $dir" >&2
        exit 1
    fi
    if [ ! -x /usr/sbin/sshd ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
    fi
    # Per-session keys: the server's host key and one client key, authorized for root.
    rm -f "$dir/host_key" "$dir/host_key.pub" "$dir/client_key" "$dir/client_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C backendconf-host -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C backendconf-client -f "$dir/client_key"
    cp "$dir/client_key.pub" "$dir/authorized_keys"
    port="${port:-$(free_port)}"
    mkdir -p /run/sshd  # sshd's privilege-separation directory
    # -f /dev/null: none of the machine's sshd_config; sshd daemonizes and writes its pid.
    /usr/sbin/sshd -f /dev/null -p "$port" -h "$dir/host_key" -o ListenAddress=127.0.0.1 \
        -o AuthorizedKeysFile="$dir/authorized_keys" -o StrictModes=no -o UsePAM=no \
        -o PidFile="$dir/sshd.pid" -E "$dir/sshd.log"
    for _ in $(seq 50); do [ -s "$dir/sshd.pid" ] && break; sleep 0.1; done
    [ -s "$dir/sshd.pid" ] || { echo "sshd did not start; see $dir/sshd.log" >&2; cat "$dir/sshd.log" >&2; exit 1; }
    local command="ssh -i $dir/client_key -p $port -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR root@127.0.0.1"
    echo "$command" > "$dir/ssh-command"
    echo "$port" > "$dir/port"
    # Up when a login works, not when the pid file appears.
    $command true || { echo "sshd runs but the login failed; see $dir/sshd.log" >&2; exit 1; }
    echo "$command"
}

# The pid of the sshd that `start DIR` started, if it still runs (else nothing).
listener() {
    local pid
    pid="$(cat "$1/sshd.pid" 2>/dev/null)" || return 0
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ]; then echo "$pid"; fi
}

drop() {
    local dir="$1" pid
    [ -n "$dir" ] || usage
    pid="$(listener "$dir")"
    [ -n "$pid" ] || { echo "no sshd runs from $dir" >&2; exit 1; }
    pkill -KILL -P "$pid" || true  # its children: one sshd per open connection
}

stop() {
    local dir="$1" pid
    [ -n "$dir" ] || usage
    pid="$(listener "$dir")"
    if [ -n "$pid" ]; then
        kill "$pid"
        pkill -KILL -P "$pid" || true
    fi
    rm -f "$dir/sshd.pid"
}

venv() {
    local dir="$1" python="${2:-python3}" hide="${HIDE:-/tmp $repo}" folder
    [ -n "$dir" ] || usage
    mkdir -p "$dir" && dir="$(cd "$dir" && pwd)"
    for folder in $hide; do
        case "$dir/" in "$folder"/*)
            echo "the target venv $dir lies in $folder, which device-python hides; put it elsewhere (or set HIDE)" >&2
            exit 2 ;;
        esac
    done
    if [ ! -x "$dir/bin/python" ]; then
        "$python" -m venv "$dir"
    fi
    local pip=("$dir/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" "torch==$TORCH"
    # The project and its reference backend without their dependencies (pytest,
    # Hypothesis, ...): the runtime needs torch and pluggy only.
    "${pip[@]}" --no-deps "$repo" "$repo/backends/reference"
    "${pip[@]}" pluggy
    if "$dir/bin/python" -c 'import pytest' 2>/dev/null || "$dir/bin/python" -c 'import hypothesis' 2>/dev/null; then
        echo "the target venv $dir has pytest or Hypothesis; it must not" >&2
        exit 1
    fi
    # The wrapper: placeholders filled in below (paths without single quotes).
    cat > "$dir/bin/device-python" <<'EOF'
#!/bin/sh
# The target venv's python as a device runs it: logged, and blind to the host's @HIDE@.
echo "$(date +%s) $$ $*" >> '@DIR@/started.log'
exec unshare --mount sh -c 'for f in @HIDE@; do [ -d "$f" ] || continue; mount -t tmpfs backendconf-hidden "$f" || exit 1; done; exec "$0" "$@"' \
    '@DIR@/bin/python' "$@"
EOF
    sed -i -e "s|@DIR@|$dir|g" -e "s|@HIDE@|$hide|g" "$dir/bin/device-python"
    chmod +x "$dir/bin/device-python"
    echo "$dir/bin/device-python"
}

case "${1:-}" in
    start) start "${2:-}" "${3:-}" ;;
    drop) drop "${2:-}" ;;
    stop) stop "${2:-}" ;;
    venv) venv "${2:-}" "${3:-}" ;;
    *) usage ;;
esac
