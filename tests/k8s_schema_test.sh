#!/usr/bin/env bash
# Every object `hyrec k8s render` and `hyrec certs --k8s` write validates offline
# (tests/k8s_validate.mjs): the example job in every overlay and API, rendered afresh.
# Usage: k8s_schema_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
tools="$build/k8s-tools"
if [ ! -d "$tools/node_modules/kubernetes-models" ]; then
  echo "k8s_schema_test: $tools/node_modules is missing (tools/test installs it with npm ci)" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
image="registry.example/hyrec@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
for overlay in local gke; do
  for api in jobset plain; do
    "$build/hyrec-k8s" render --config="$src/examples/configs/cluster.yaml" --name=user-item --image="$image" \
      --overlay="$overlay" --api="$api" > "$out/$overlay-$api.yaml" 2> "$out/render.err" || {
      cat "$out/render.err" >&2
      exit 1
    }
  done
done
"$build/hyrec-certs" --dir="$out/certs" --config="$src/examples/configs/cluster.yaml" --k8s=user-item \
  --k8s_out="$out/secrets.yaml" > /dev/null
cp "$src/tests/k8s_validate.mjs" "$tools/k8s_validate.mjs"
crd="$src/../shared/k8s/jobset.x-k8s.io_jobsets.v0.12.0.yaml"
node "$tools/k8s_validate.mjs" --crd="$crd" "$out"/*.yaml "$src"/deploy/k8s/*/*.yaml
