#!/usr/bin/env bash
# Installs with apt whatever Troupe's build and tests need and this machine lacks.
# A no-op (one dpkg query) when everything is present. Extra package names may be passed
# as arguments (the benchmarks pass their peers: libcaf-dev, golang-go, erlang-base,
# python3-torch).
set -euo pipefail

# clang-format and git: the style and dependency checks (scripts/check-*.sh).
# ocl-icd-opencl-dev: Debian's oneDNN CMake package is built for OpenCL and fails to load
# without it, but libdnnl-dev only recommends it (and we install without recommends).
pkgs=(cmake pkg-config make gcc libuv1-dev libmsgpack-dev libjansson-dev libaio-dev
      libcmocka-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin
      python3 clang-format git "$@")

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
