#!/usr/bin/env bash
# An emulated aarch64 device on an x86-64 Debian machine, for the target half of
# the suite: an arm64 Python unpacked from Debian's packages into ROOT, run by
# QEMU user mode, with torch $TORCH (2.10.0: the newest CPU-only aarch64 build on
# the package index; later aarch64 wheels need CUDA 13), the reference backend
# and the project's runtime. Neither the machine's Python nor its dpkg state is
# touched: a private APT configuration downloads the arm64 packages, and pip
# installs into ROOT with --target. As root (apt-get installs qemu-user-static).
#
#   devices/aarch64-device.sh [ROOT]     build (default ROOT: ~/.cache/backendconf/aarch64-device)
#
# Idempotent: a finished step leaves a stamp in ROOT/.build and is skipped next
# time; the project's own wheels are reinstalled every time (they change). Each
# step prints its time. The device's Python is then
#
#   qemu-aarch64-static -L ROOT ROOT/usr/bin/python3.11
#
# which finds the packages without PYTHONPATH: they are in ROOT/usr/lib/python3/dist-packages,
# on the path of Debian's python3.11 (its prefix is ROOT/usr).
set -euo pipefail

ROOT="${1:-$HOME/.cache/backendconf/aarch64-device}"
TORCH="${TORCH:-2.10.0}"
# torch's own dependencies, by hand: pip evaluates environment markers for the
# host, not the device. numpy is optional for torch and unused by the runtime.
TORCH_DEPS=(typing-extensions sympy mpmath networkx jinja2 markupsafe filelock fsspec)
# The project's runtime dependency (pytest and Hypothesis are the host's, not the device's).
RUNTIME_DEPS=(pluggy)
DEBS=(python3.11 libstdc++6 libgomp1)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
mkdir -p "$ROOT/.build" && ROOT="$(cd "$ROOT" && pwd)"
build="$ROOT/.build"
site="$ROOT/usr/lib/python3/dist-packages"

# step NAME COMMAND...: run COMMAND unless NAME is stamped; print its time either way.
step() {
    local name="$1"; shift
    if [ -f "$build/done-$name" ]; then
        echo "[$name] done before, skipped"
        return
    fi
    local start=$SECONDS
    "$@"
    touch "$build/done-$name"
    echo "[$name] $((SECONDS - start)) s"
}

install_qemu() {
    if ! command -v qemu-aarch64-static >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
    fi
}

# A private APT: arm64 only, its own state, lists, cache and sources (Debian's
# main archive for this machine's release), so nothing of the system's apt changes.
arm64_debs() {
    local codename
    codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
    mkdir -p "$build/apt/lists/partial" "$build/apt/cache/archives/partial" "$build/apt/sources.list.d"
    : > "$build/apt/status"
    cat > "$build/apt/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $codename main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $codename-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security $codename-security main
EOF
    cat > "$build/apt/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
Dir::State "$build/apt";
Dir::State::Lists "$build/apt/lists";
Dir::State::status "$build/apt/status";
Dir::Cache "$build/apt/cache";
Dir::Etc::SourceList "$build/apt/sources.list";
Dir::Etc::SourceParts "$build/apt/sources.list.d";
// Its folders are root's, not the _apt user's.
APT::Sandbox::User "root";
EOF
    APT_CONFIG="$build/apt/apt.conf" apt-get update -qq
    APT_CONFIG="$build/apt/apt.conf" apt-get install -d -y -qq --no-install-recommends "${DEBS[@]}" >/dev/null
}

unpack_debs() {
    local deb
    for deb in "$build"/apt/cache/archives/*.deb; do
        dpkg-deb -x "$deb" "$ROOT"
    done
}

# pip for the device: wheels for manylinux aarch64, CPython 3.11, no dependency resolution.
device_pip() {
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$site" --no-deps --only-binary=:all: \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        --python-version 3.11 --implementation cp --abi cp311 "$@"
}

torch_and_deps() {
    device_pip "torch==$TORCH" "${TORCH_DEPS[@]}" "${RUNTIME_DEPS[@]}"
}

# The project and the reference backend: pure-Python wheels built here.
project() {
    rm -rf "$build/wheels"
    python3 -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$build/wheels" "$repo" "$repo/backends/reference"
    device_pip --upgrade "$build"/wheels/*.whl
    # --upgrade replaces the two packages' folders, and leaves the rest of the site alone.
}

check() {
    local start=$SECONDS
    qemu-aarch64-static -L "$ROOT" "$ROOT/usr/bin/python3.11" -c \
        'import platform, torch, pytest_backendconf; print(platform.machine(), torch.__version__)'
    echo "[check] $((SECONDS - start)) s"
}

step qemu install_qemu
step arm64-debs arm64_debs
step unpack unpack_debs
step torch torch_and_deps
start=$SECONDS; project; echo "[project] $((SECONDS - start)) s"
check
du -sh "$ROOT" --exclude=.build | sed 's/\t.*/ (the device, without its build cache)/'
echo "device python: qemu-aarch64-static -L $ROOT $ROOT/usr/bin/python3.11"
