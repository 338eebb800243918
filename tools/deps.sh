#!/usr/bin/env bash
# Installs the Debian packages hyrec builds and runs with, only those that are missing.
# Sourced by tools/test and tools/demo; safe to run again (quick when everything is present).
set -euo pipefail

HYREC_DEBS=(
  build-essential cmake ninja-build pkg-config ccache clang-format
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev zlib1g-dev libxxhash-dev libcpp-httplib-dev libssl-dev
)

hyrec_missing_debs() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}

# hyrec_install_debs [more packages...]: HYREC_DEBS and the given ones, those missing.
hyrec_install_debs() {
  local missing
  missing=$(hyrec_missing_debs "${HYREC_DEBS[@]}" "$@")
  if [ -z "$missing" ]; then
    return 0
  fi
  echo "hyrec: installing missing Debian packages:" $missing
  local sudo=""
  if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  $sudo apt-get install -y -qq --no-install-recommends $missing
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  hyrec_install_debs
fi
