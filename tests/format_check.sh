#!/usr/bin/env bash
# The tree follows the committed .clang-format: every C++ file of the project, checked with
# clang-format (installed by tools/deps.sh); exits 77 (skipped) where clang-format is absent.
#   tests/format_check.sh SOURCE_DIR
set -euo pipefail
cd "$1"
command -v clang-format > /dev/null || { echo "clang-format is not installed: skipped"; exit 77; }
mapfile -t files < <(find include src tests benchmarks examples -name '*.cc' -o -name '*.h' | grep -v '/corpus/' | sort)
if ! clang-format --dry-run --Werror "${files[@]}" 2> /tmp/hyrec_format_check.$$; then
  grep -E "^[^ ].*(warning|error):" /tmp/hyrec_format_check.$$ | head -20
  rm -f /tmp/hyrec_format_check.$$
  echo "not formatted as .clang-format says; run: clang-format -i <file>"
  exit 1
fi
rm -f /tmp/hyrec_format_check.$$
echo "${#files[@]} files formatted"
