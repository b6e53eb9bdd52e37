#!/usr/bin/env bash
# Runs epp's cargo-fuzz targets (hack/fuzz) under libFuzzer, each bounded by a run count and a
# wall-clock limit, at the lowest CPU priority. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). New corpus entries go to hack/fuzz/target/corpus/<target>
# (gitignored); the committed seeds in hack/fuzz/corpus/<target> are read, never written.
# Crashes land in hack/fuzz/artifacts/<target>/: turn each into a regression test.
#
# usage: hack/fuzz.sh [-r RUNS] [-t SECONDS] [-n] [TARGET...]
#   -n: run the binaries already built, without rebuilding (cargo fuzz run rebuilds epp in
#       release whenever a source file changed, which costs minutes on a busy machine).
#   defaults: RUNS=10000000, SECONDS=3600 per target, all targets, one after another.
#   FUZZ_ARGS adds libFuzzer flags, e.g. FUZZ_ARGS="-fork=1 -ignore_crashes=1" to keep going
#   past a known crash (each crash is still saved under hack/fuzz/artifacts/<target>/).
# The stable test suite runs the same bodies briefly: e2e/tests/fuzz_smoke.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
fz=hack/fuzz
runs=10000000
seconds=3600
build=1
while getopts "r:t:n" opt; do
  case $opt in
    r) runs=$OPTARG ;;
    t) seconds=$OPTARG ;;
    n) build=0 ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(request_parser prefix_hasher prometheus_text kv_events picker_config extproc_stream)
fi
export CARGO_TARGET_DIR="$PWD/$fz/target"
# Safe Rust (unsafe_code is forbidden in epp): no sanitizer, so libFuzzer runs at full speed;
# panics, overflows (debug assertions are on) and timeouts are the findings.
for t in "${targets[@]}"; do
  [ $build = 1 ] || break
  nice -n 19 cargo +nightly fuzz build --fuzz-dir "$fz" --sanitizer none --debug-assertions "$t"
done
printf '%-16s %12s %8s %10s %s\n' target executions seconds exec/s result
for t in "${targets[@]}"; do
  mkdir -p "$fz/target/corpus/$t" "$fz/artifacts/$t"
  log="$fz/target/fuzz-$t.log"
  start=$(date +%s)
  touch "$log.start"
  set +e
  if [ $build = 1 ]; then
    run=(cargo +nightly fuzz run --fuzz-dir "$fz" --sanitizer none --debug-assertions "$t" "$fz/target/corpus/$t" "$fz/corpus/$t" --)
  else
    run=("$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/$t" "$fz/target/corpus/$t" "$fz/corpus/$t")
  fi
  nice -n 19 timeout $((seconds + 120)) "${run[@]}" \
    -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$fz/artifacts/$t/" -print_final_stats=1 ${FUZZ_ARGS:-} >"$log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  execs=$( (grep -ho 'stat::number_of_executed_units: *[0-9]*' "$log" || true) | awk '{s += $2} END {print s + 0}')
  if [ "$execs" = 0 ]; then
    execs=$( (grep -o 'Done [0-9]* runs' "$log" || true) | awk '{s += $2} END {print s + 0}')
  fi
  if [ "$execs" = 0 ]; then # fork mode, or stopped by a crash: the last status line's count
    execs=$( (grep -o '^#[0-9]*' "$log" || true) | tail -1 | tr -d '#')
    execs=${execs:-0}
  fi
  crashes=$(find "$fz/artifacts/$t" -name 'crash-*' -newer "$log.start" 2>/dev/null | wc -l)
  result="ok, $crashes crash inputs"
  [ $rc -ne 0 ] && result="FAILED (exit $rc, $crashes crash inputs; see $log and $fz/artifacts/$t)"
  printf '%-16s %12s %8s %10s %s\n' "$t" "$execs" "$took" "$(( execs / (took > 0 ? took : 1) ))" "$result"
done
