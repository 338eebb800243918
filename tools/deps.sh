#!/usr/bin/env bash
# Installs the Debian packages hyrec builds and runs with, only those that are missing.
# Sourced by tools/test and tools/demo; safe to run again (quick when everything is present).
set -euo pipefail

HYREC_DEBS=(
  build-essential cmake ninja-build pkg-config ccache clang-format
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev zlib1g-dev libxxhash-dev libcpp-httplib-dev libssl-dev librdkafka-dev
  liburing-dev librocksdb-dev
  iproute2
)

# What the installed binaries need at run time (the Dockerfile's runtime stage): the shared
# libraries of the packages above, without compilers and headers.
HYREC_RUNTIME_DEBS=(
  libtorch1.13 libopenblas0-pthread libgloo0 libgrpc++1.51 libgrpc29 libprotobuf32
  libabsl20220623 libspdlog1.10 libfmt9 libyaml-cpp0.7 zlib1g libxxhash0 libcpp-httplib0.11 libssl3 librdkafka1 liburing2
  ca-certificates
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
  hyrec_install_package_list "${HYREC_DEBS[@]}" "$@"
}

# hyrec_install_package_list PACKAGES...: those of them that are missing.
hyrec_install_package_list() {
  local missing
  missing=$(hyrec_missing_debs "$@")
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

hyrec_install_runtime_debs() {
  hyrec_install_package_list "${HYREC_RUNTIME_DEBS[@]}"
}

# hyrec_install_k8s_tools DIR: node and npm (Debian's, when missing), then the npm packages of
# tools/k8s/package-lock.json in DIR, which the manifest validation test runs from.
hyrec_install_k8s_tools() {
  local dir="$1" root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
    hyrec_install_debs nodejs npm
  fi
  mkdir -p "$dir"
  if [ -d "$dir/node_modules/kubernetes-models" ] && cmp -s "$root/tools/k8s/package-lock.json" "$dir/package-lock.json"; then
    return 0
  fi
  cp "$root/tools/k8s/package.json" "$root/tools/k8s/package-lock.json" "$dir/"
  echo "hyrec: installing the manifest validators (npm ci in $dir)"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  hyrec_install_debs
fi
