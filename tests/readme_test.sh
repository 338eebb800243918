#!/usr/bin/env bash
# Runs README.md's commands as a newcomer would: in the README's order, from a scratch folder in
# which build/ and examples/ are this build and this checkout's examples. Every command of the
# README must be one this script knows exactly (a README command it does not know fails the test),
# so the README cannot drift from what runs.
#
# Each command runs as written, except:
# - training on the synthetic teacher gets `--set` overrides that shorten it (fewer samples);
# - the README's placeholders are filled in: REPO/...@sha256:DIGEST (an image reference),
#   ckpt-... (the newest checkpoint), job.yaml (a job written here with its own ports);
# - a few are not run here, each for the reason given below (tools/test is this test's runner).
# It ends with the installed package's checks: its size, no debug information, and the program
# built against it trained with --processes and refusing a bad model option.
#   tests/readme_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2> /dev/null || true; rm -rf "$work"' EXIT
cd "$work"
ln -s "$build" build
ln -s "$source/examples" examples
if command -v ccache > /dev/null; then
  # The user's cache, not one under the scratch HOME below.
  CCACHE_DIR=${CCACHE_DIR:-$(ccache -k cache_dir 2> /dev/null || true)}
  if [ -n "$CCACHE_DIR" ]; then export CCACHE_DIR; fi
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=1
fi
export HOME="$work"
# Debian's python3 (with python3-torch, which tools/test installs), before any other on PATH.
export PATH="/usr/bin:/bin:$PATH"

fail() {
  echo "readme_test: $*" >&2
  exit 1
}
# run LOG COMMAND...: runs the command (at most 5 minutes), its output in LOG and LOG.err; a
# failure shows them.
run() {
  local log=$1
  shift
  echo "\$ $*"
  if ! timeout 300 bash -c "$*" > "$log" 2> "$log.err"; then
    tail -n 30 "$log" "$log.err" >&2
    fail "failed: $*"
  fi
}
# expect_in LOG TEXT COMMAND: LOG or LOG.err has a line with TEXT.
expect_in() {
  grep -q -s -- "$2" "$1" "$1.err" || {
    tail -n 30 "$1" "$1.err" >&2
    fail "no '$2' in the output of $3"
  }
}
# await_line LOG TEXT SECONDS: until LOG has a line with TEXT.
await_line() {
  local deadline=$(($(date +%s) + $3))
  until grep -q -- "$2" "$1"; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no '$2' in $1 within $3 s"
    sleep 0.2
  done
}
# await_exit PID SECONDS: its exit status, or a failure when it runs longer.
await_exit() {
  local deadline=$(($(date +%s) + $2))
  while kill -0 "$1" 2> /dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "process $1 still runs after $2 s"
    sleep 0.2
  done
  wait "$1"
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

short_synthetic="--set loader.source.synthetic.num_samples=40960 --set eval.samples=4000 --set eval.every_batches=40"
image="registry.example/hyrec@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
# The data criteo-sample.yaml reads (the Kaggle file is not redistributable): lines in the
# challenge's format, label, 13 integer and 26 hexadecimal columns.
criteo_lines() {
  awk -v n="$1" -v seed="$2" 'BEGIN {
    srand(seed)
    for (i = 0; i < n; i++) {
      x = int(rand() * 20); line = (x + rand() * 10 > 15) ? "1" : "0"
      for (j = 0; j < 13; j++) line = line "\t" (rand() < 0.1 ? "" : int(rand() * 100) + (j == 0 ? x : 0))
      for (j = 0; j < 26; j++) line = line "\t" sprintf("%08x", int(rand() * (j == 0 ? 20 : 500)) + (j == 0 ? x : 0))
      print line
    }
  }'
}

seen=()
handle() {
  local cmd=$1 log
  log="$work/$(printf '%03d' "${#seen[@]}").log"
  seen+=("$cmd")
  case "$cmd" in
    "tools/demo")
      # Installs packages and builds (not from a test); what it then runs is the next command.
      grep -q 'exec "$HYREC_BUILD_DIR/hyrec" train --config=examples/configs/synthetic.yaml "$@"' \
        "$source/tools/demo" || fail "tools/demo no longer trains examples/configs/synthetic.yaml"
      ;;
    "tools/test" | "tools/test -L unit") ;;  # This test's own runner.
    "tools/image-check")
      # Installs and starts a Docker daemon as root: run by hand (README), never by ctest.
      [ -x "$source/tools/image-check" ] || fail "tools/image-check is missing"
      ;;
    "build/hyrec train --config=examples/configs/synthetic.yaml" | \
      "build/hyrec train --config=examples/configs/synthetic.yaml --processes" | \
      "build/hyrec train --config=examples/configs/user-item.yaml" | \
      "build/hyrec train --config=examples/configs/synthetic.yaml --metrics_port=9090")
      run "$log" "$cmd $short_synthetic"
      expect_in "$log" "^summary: 40960 samples" "$cmd"
      ;;
    "build/hyrec train --config=examples/configs/criteo-sample.yaml")
      mkdir -p data/criteo
      criteo_lines 2000 1 > data/criteo/train.tsv
      criteo_lines 500 2 > data/criteo/test.tsv
      run "$log" "$cmd"
      expect_in "$log" "^summary: 6000 samples" "$cmd"
      # At staleness 0 (what criteo-sample.yaml runs) there is no window to note.
      if grep -q -s "staleness windows" "$log" "$log.err"; then fail "$cmd: a staleness note at staleness 0"; fi
      ;;
    "build/hyrec train --config=examples/configs/clicks-csv.yaml")
      run "$log" "$cmd"
      expect_in "$log" "^summary: " "$cmd"
      [ -d clicks-model ] || fail "$cmd left no clicks-model/"
      # Its epoch of 32 batches is only 8 windows of its staleness 4: the log says so
      # (docs/architecture.md, "Choosing the staleness").
      expect_in "$log" "hyrec: note: an epoch is 32 steps, only 8 staleness windows of 4" "$cmd"
      ;;
    "build/hyrec ps-demo")
      run "$log" "$cmd"
      ;;
    "build/hyrec train --config=examples/configs/cluster.yaml")
      # Ctrl-C part-way: it stops after the current batch with a checkpoint and exits 130.
      echo "\$ $cmd   (Ctrl-C after its first progress line)"
      $cmd > "$log" 2>&1 &
      local pid=$!
      await_line "$log" "samples/s" 120
      kill -INT "$pid"
      local code=0
      await_exit "$pid" 120 || code=$?
      [ "$code" = 130 ] || { tail -30 "$log" >&2; fail "$cmd: exit $code after Ctrl-C, expected 130"; }
      ls -d cluster-checkpoints/ckpt-* > /dev/null || fail "Ctrl-C cut no checkpoint"
      ;;
    "build/hyrec train --config=examples/configs/cluster.yaml --resume=latest")
      run "$log" "$cmd"
      expect_in "$log" "^summary: 600000 samples" "$cmd"
      grep -q "nothing left to train" "$log" && fail "$cmd: the interrupted run had nothing left"
      [ -d cluster-model ] || fail "$cmd left no cluster-model/"
      ;;
    "build/hyrec checkpoint verify clicks-checkpoints/ckpt-...")
      local newest
      newest=$(ls -d clicks-checkpoints/ckpt-* | sort | tail -1)
      run "$log" "${cmd/clicks-checkpoints\/ckpt-.../$newest}"
      ;;
    "build/hyrec predict --model=clicks-model --input=examples/data/clicks_test.csv")
      run "$log" "$cmd"
      [ "$(wc -l < "$log")" = "$(($(wc -l < examples/data/clicks_test.csv) - 1))" ] ||
        fail "$cmd: not one probability a line of the input"
      ;;
    "build/hyrec predict --model=clicks-model --input=examples/data/clicks_test.csv --keep=id,site")
      run "$log" "$cmd"
      [ "$(head -1 "$log")" = "id,site,probability" ] || fail "$cmd: the header is '$(head -1 "$log")'"
      ;;
    "build/hyrec eval --model=clicks-model --input=examples/data/clicks_test.csv" | \
      "build/hyrec eval --model=python-model/export --input=examples/data/clicks_test.csv")
      run "$log" "$cmd"
      expect_in "$log" "^auc: 0\." "$cmd"
      ;;
    "build/hyrec certs --dir=certs --config=job.yaml")
      # The README's own job, with its roles' addresses on this machine's free ports.
      cat > job.yaml << YAML
loader:
  source:
    format: synthetic
    synthetic: {num_samples: 20480, vocabulary: 1000, seed: 1}
  batch_size: 256
  threads: 1
eval: {samples: 2000}
model: {kind: dlrm, embedding_dim: 8, bottom: [16], top: [16]}
ps: {shards: 2}
train: {workers: 1, log_every_batches: 20}
cluster:
  ps: [127.0.0.1:$(free_port), 127.0.0.1:$(free_port)]
  loader: 127.0.0.1:$(free_port)
  master: 127.0.0.1:$(free_port)
  services_exit_when_done: true
YAML
      run "$log" "$cmd"
      [ -f certs/ps-1.pem ] || fail "$cmd wrote no certs/ps-1.pem"
      ;;
    "build/hyrec ps --config=job.yaml --shard_index=0 &" | "build/hyrec ps --config=job.yaml --shard_index=1 &" | \
      "build/hyrec loader --config=job.yaml &")
      echo "\$ $cmd"
      ${cmd% &} > "$log" 2>&1 &
      services+=($!)
      ;;
    "build/hyrec worker --config=job.yaml --rank=0")
      run "$log" "$cmd"
      expect_in "$log" "^summary: 20480 samples" "$cmd"
      # Told by worker 0 that the job is done (cluster.services_exit_when_done), each exits 0.
      for pid in "${services[@]}"; do
        await_exit "$pid" 60 || fail "a hand-started service exited $? after the job"
      done
      ;;
    "build/hyrec certs --dir=k8s-certs --config=examples/configs/cluster.yaml --k8s=user-item")
      run "$log" "$cmd"
      [ -f k8s-certs/k8s-secrets.yaml ] || fail "$cmd wrote no k8s-certs/k8s-secrets.yaml"
      ;;
    "build/hyrec k8s render --config=examples/configs/cluster.yaml --name=user-item --image=REPO/hyrec@sha256:DIGEST --overlay=gke --out=rendered")
      run "$log" "${cmd/REPO\/hyrec@sha256:DIGEST/$image}"
      [ -f rendered/user-item.yaml ] || fail "$cmd wrote no rendered/user-item.yaml"
      ;;
    "kubectl apply -f k8s-certs/k8s-secrets.yaml -f rendered/user-item.yaml")
      # No cluster here: what kubectl would send is validated offline against the API's
      # schemas and the JobSet CRD, as k8s_schema_test does.
      local tools="$build/k8s-tools"
      [ -d "$tools/node_modules/kubernetes-models" ] || fail "$tools/node_modules is missing (tools/test installs it)"
      cp "$source/tests/k8s_validate.mjs" "$tools/k8s_validate.mjs"
      run "$log" node "$tools/k8s_validate.mjs" --crd="$source/../shared/k8s/jobset.x-k8s.io_jobsets.v0.12.0.yaml" \
        k8s-certs/k8s-secrets.yaml rendered/user-item.yaml
      ;;
    "build/hyrec plan --config=examples/configs/synthetic.yaml --parameters=100T --ps_shards=30 --ps_machine=m2-ultramem-416 --workers=8 --batch_size=65536 --set ps.capacity_rows=60000000000 --set ps.num_stripes=16384")
      run "$log" "$cmd"
      expect_in "$log" "m2-ultramem-416" "$cmd"
      ;;
    "build/hyrec plan --calibrate --config=examples/configs/synthetic.yaml --out=calibration.yaml")
      run "$log" "$cmd"
      [ -f calibration.yaml ] || fail "$cmd wrote no calibration.yaml"
      ;;
    "build/hyrec plan --config=examples/configs/synthetic.yaml --calibration=calibration.yaml --scaling")
      run "$log" "$cmd"
      expect_in "$log" "^  expected: [0-9]* samples/s, bound by " "$cmd"
      expect_in "$log" "^scaling (simulated" "$cmd"
      ;;
    'cmake --install build --prefix "$HOME/hyrec"' | \
      'cmake -S examples/custom_model -B build-custom -G Ninja -DCMAKE_PREFIX_PATH="$HOME/hyrec"')
      run "$log" "$cmd"
      ;;
    "cmake --build build-custom && build-custom/two_tower_trainer --config=examples/custom_model/job.yaml")
      run "$log" "$cmd $short_synthetic"
      expect_in "$log" "^summary: 40960 samples" "$cmd"
      ;;
    "python3 examples/python_model/model.py --out=python-model")
      run "$log" "$cmd"
      [ -f python-model/module.pt ] || fail "$cmd wrote no python-model/module.pt"
      ;;
    "build/hyrec train --config=python-model/job.yaml")
      run "$log" "$cmd"
      expect_in "$log" "^summary: " "$cmd"
      ;;
    *) fail "README.md has a command this test does not know; add how to run it here: $cmd" ;;
  esac
}

services=()
mapfile -t commands < <("$source/tests/readme_commands.sh" "$source/README.md")
[ "${#commands[@]}" -gt 20 ] || fail "found only ${#commands[@]} commands in README.md"
for cmd in "${commands[@]}"; do
  handle "$cmd"
done
echo "README commands run or accounted for: ${#seen[@]}"

# The installed package (the README's `cmake --install` above): stripped, at most 150 MB, and the
# program built against it trains with --processes and refuses a bad model option naming it.
installed_kb=$(du -sk "$HOME/hyrec" | cut -f1)
[ "$installed_kb" -le 153600 ] || fail "the install takes $((installed_kb / 1024)) MB, more than 150"
sections=$(readelf -S "$HOME/hyrec/bin/hyrec-train")
if grep -q '\.debug_info' <<< "$sections"; then
  fail "bin/hyrec-train was installed with its debug information"
fi
run processes.log build-custom/two_tower_trainer --config=examples/custom_model/job.yaml --processes $short_synthetic
expect_in processes.log "^processes: 2 PS" "two_tower_trainer --processes"
expect_in processes.log "^summary: 40960 samples" "two_tower_trainer --processes"
sed 's/width: 32/widht: 32/' examples/custom_model/job.yaml > bad.yaml
set +e
build-custom/two_tower_trainer --config=bad.yaml --plot= > /dev/null 2> bad.txt
code=$?
set -e
[ "$code" = 2 ] || fail "bad model options: exit $code, expected 2"
grep -q "model.options.widht" bad.txt || fail "bad model options: the error does not name model.options.widht"
echo "readme_test: ok"
