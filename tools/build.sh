#!/usr/bin/env bash
# Installs missing Debian packages, configures (once) and builds hyrec into build/.
# Sourced by tools/test and tools/demo. HYREC_BUILD_DIR overrides the build folder;
# HYREC_TARGETS (space-separated) builds only those targets; HYREC_EXTRA_DEBS adds packages.
set -euo pipefail
HYREC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HYREC_BUILD_DIR="${HYREC_BUILD_DIR:-$HYREC_ROOT/build}"
# shellcheck source=tools/deps.sh
source "$HYREC_ROOT/tools/deps.sh"
# shellcheck disable=SC2086
hyrec_install_debs ${HYREC_EXTRA_DEBS:-}
# ccache: paths relative to the checkout, so a fresh clone (CI) reuses an earlier build's objects.
export CCACHE_BASEDIR="$HYREC_ROOT"
export CCACHE_NOHASHDIR=1
# The LibTorch targets' precompiled header (CMakeLists.txt, HYREC_TORCH_PCH) is cacheable only so.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
if [ ! -f "$HYREC_BUILD_DIR/build.ninja" ]; then
  cmake -S "$HYREC_ROOT" -B "$HYREC_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
targets=()
for t in ${HYREC_TARGETS:-}; do targets+=(--target "$t"); done
# Two cores: two compile jobs keep the machine responsive and memory in bounds.
cmake --build "$HYREC_BUILD_DIR" -j "${HYREC_JOBS:-2}" "${targets[@]}"
