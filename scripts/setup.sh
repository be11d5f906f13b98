#!/usr/bin/env bash
# Installs the Debian packages eccl builds and tests with (idempotent).
set -euo pipefail
packages=(cmake ninja-build g++ clang pkg-config iproute2
  libibverbs-dev librdmacm-dev libhwloc-dev openmpi-bin libopenmpi-dev libgloo-dev
  libgtest-dev libbenchmark-dev libssl-dev libisal-dev libcli11-dev nlohmann-json3-dev libfmt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
