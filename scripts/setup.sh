#!/usr/bin/env bash
# Installs every Debian package the build needs, then configures and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config libopenblas-dev nlohmann-json3-dev libpcre2-dev libcli11-dev libfmt-dev
      libgtest-dev libbenchmark-dev libcpp-httplib-dev)
if ! dpkg -s "${PKGS[@]}" >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${PKGS[@]}"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
