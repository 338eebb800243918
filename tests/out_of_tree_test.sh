#!/usr/bin/env bash
# The C++ API from outside the source tree: installs this build into a prefix (`cmake --install`),
# builds examples/custom_model against it as a separate CMake project (find_package(hyrec)), then
# trains its own model with it, embedded and with --processes (the program is every role).
#   tests/out_of_tree_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
work="$build/out_of_tree"
rm -rf "$work/prefix"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# The install is stripped of debug information (cmake/HyrecInstall.cmake): at most 150 MB.
installed_kb=$(du -sk "$work/prefix" | cut -f1)
[ "$installed_kb" -le 153600 ] || { echo "the install takes $((installed_kb / 1024)) MB, more than 150"; exit 1; }
if readelf -S "$work/prefix/bin/hyrec-train" | grep -q '\.debug_info'; then
  echo "bin/hyrec-train was installed with its debug information"
  exit 1
fi
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source/examples/custom_model" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j "${HYREC_JOBS:-2}" > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
trainer="$work/build/two_tower_trainer"
# The example's job, shortened.
sed -e 's/num_samples: 300000/num_samples: 40960/' -e 's/samples: 20000, every_batches: 200/samples: 4000, every_batches: 40/' \
  "$source/examples/custom_model/job.yaml" > "$work/job.yaml"
check() {
  local out=$1
  grep -q "^summary: 40960 samples" "$out" || { echo "no summary in $out"; cat "$out"; exit 1; }
  local auc
  auc=$(sed -n 's/^  held-out AUC \([0-9.]*\),.*/\1/p' "$out")
  awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || { echo "held-out AUC '$auc' is not above 0.6"; cat "$out"; exit 1; }
}
"$trainer" --config="$work/job.yaml" --plot= --progress=lines > "$work/embedded.txt"
check "$work/embedded.txt"
"$trainer" --config="$work/job.yaml" --processes --plot= --progress=lines > "$work/processes.txt"
check "$work/processes.txt"
grep -q "^processes: 2 PS" "$work/processes.txt"
# A mistake in the model's own options is the program's error, with hyrec's exit code.
sed 's/width: 32/widht: 32/' "$work/job.yaml" > "$work/bad.yaml"
set +e
"$trainer" --config="$work/bad.yaml" --plot= > /dev/null 2> "$work/bad.txt"
code=$?
set -e
[ "$code" = 2 ] || { echo "bad model options: exit $code, expected 2"; cat "$work/bad.txt"; exit 1; }
grep -q "model.options.widht" "$work/bad.txt"
echo "out-of-tree build and training: ok"
