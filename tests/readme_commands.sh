#!/usr/bin/env bash
# Prints the commands of a Markdown file's ```sh blocks, one a line, in order: continuation lines
# joined, comments dropped, runs of blanks made one.
#   tests/readme_commands.sh README.md
set -euo pipefail
awk '
  /^```sh$/ { inside = 1; next }
  /^```$/   { inside = 0; next }
  !inside   { next }
  {
    line = $0
    if (line ~ /\\$/) { sub(/\\$/, "", line); pending = pending line; next }
    line = pending line; pending = ""
    sub(/[ \t]+#.*$/, "", line); sub(/^[ \t]+/, "", line); gsub(/[ \t]+/, " ", line)
    if (line != "") print line
  }' "$1"
