#!/usr/bin/env bash
# The Dockerfile's runtime stage installs HYREC_RUNTIME_DEBS (tools/deps.sh) and copies the
# installed tree: every shared library the binaries load must come from those packages or their
# dependencies, and the image's layout must be the one the rendered manifests run.
# Usage: runtime_debs_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
# shellcheck source=tools/deps.sh
source "$src/tools/deps.sh"
fail=0
missing=$(hyrec_missing_debs "${HYREC_RUNTIME_DEBS[@]}")
if [ -n "$missing" ]; then
  echo "HYREC_RUNTIME_DEBS names packages that are not installed beside the build's: $missing"
  fail=1
fi
mapfile -t libs < <(for b in "$build"/hyrec "$build"/hyrec-*; do
  [ -x "$b" ] && [ -f "$b" ] && ldd "$b" 2> /dev/null | awk '/=> \//{print $3}'
done | sort -u | xargs -r realpath | sort -u)
# One dpkg query for every library, under its /usr and its / name (merged /usr).
mapfile -t owners < <(dpkg -S "${libs[@]}" "${libs[@]#/usr}" 2> /dev/null | cut -d: -f1 | sed 's/,.*//' | sort -u)
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances "${HYREC_RUNTIME_DEBS[@]}" 2> /dev/null | grep -v '^ ' | sed 's/:amd64$//' | sort -u)
for p in "${owners[@]}"; do
  if ! grep -qx "$p" <<< "$closure"; then
    echo "the binaries load a library of $p, which the runtime packages do not bring"
    fail=1
  fi
done
[ "${#owners[@]}" -gt 10 ] || { echo "found the owners of only ${#owners[@]} of ${#libs[@]} libraries"; fail=1; }
# The layout the manifests run: /opt/hyrec/bin/hyrec as uid 10001.
for want in "cmake --install build --prefix /opt/hyrec" 'ENTRYPOINT ["/opt/hyrec/bin/hyrec"]' "USER 10001:10001" \
  "tools/deps.sh" "tools/build.sh"; do
  grep -qF "$want" "$src/Dockerfile" || { echo "the Dockerfile lacks: $want"; fail=1; }
done
for manifest in "$src"/deploy/k8s/*/*.yaml; do
  for want in "- /opt/hyrec/bin/hyrec" "runAsUser: 10001"; do
    grep -qF -- "$want" "$manifest" || { echo "$manifest lacks: $want"; fail=1; }
  done
done
[ "$fail" = 0 ] && echo "${#libs[@]} libraries from ${#owners[@]} packages, all from the runtime packages"
exit "$fail"
