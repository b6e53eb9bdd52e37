#!/usr/bin/env bash
# Instructions per small request in an ext_proc server, counted by callgrind (reproducible on a
# loaded machine, where CPU time is not). Envoy (duplex ext_proc, as in the overhead runs) in
# front of 4 inference-sim pods a million times faster than real time (figures from before the
# stand-in's removal in #16 were taken with the older `model-server` stand-in); the server
# under test runs under valgrind with instrumentation off until a warm-up of 200 requests is
# done, then counts N closed-loop requests (20-token prompt, 1 output token, concurrency 4).
# Metrics scraping is slowed to once an hour so that only per-request work is counted.
#
#   hack/bench/callgrind.sh [epp|noop] [N] [BINARY]   (default: epp 2000 target/release/<bin>)
#
# Prints `Ir per request`; the callgrind dump and a top-function list stay in target/callgrind/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
what=${1:-epp}; n=${2:-2000}
case "$what" in
  epp) bin=${3:-target/release/epp} ;;
  noop) bin=${3:-target/release/noop-extproc} ;;
  *) echo "usage: $0 [epp|noop] [N] [BINARY]" >&2; exit 2 ;;
esac
envoy="${EPP_ENVOY:-$(hack/install-envoy.sh)}"
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
d="target/callgrind/$what-$(date +%s)"; mkdir -p "$d"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
backends=(); for _ in 1 2 3 4; do backends+=("$(port)"); done
grpc=$(port); health=$(port); metrics=$(port); admin=$(port); listen=$(port)
eps=$(printf '127.0.0.1:%s,' "${backends[@]}"); eps=${eps%,}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for b in "${backends[@]}"; do
  target/release/inference-sim --port "$b" --pod-name-prefix "pod-$b" --model m --time-scale 1000000 >"$d/inference-sim-$b.log" 2>&1 &
  pids+=($!)
done
vg=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$d/callgrind.out")
if [[ "$what" == epp ]]; then
  "${vg[@]}" "$bin" --grpc-port "$grpc" --grpc-health-port "$health" --metrics-port "$metrics" --secure-serving=false \
    --static-endpoints "$eps" --config-file hack/bench/epp-default.yaml --zap-log-level error \
    --refresh-metrics-interval 3600s --metrics-staleness-threshold 7200s >"$d/server.log" 2>&1 &
else
  "${vg[@]}" "$bin" --port "$grpc" --endpoints "$eps" >"$d/server.log" 2>&1 &
fi
server=$!; pids+=($server)
ADMIN_PORT=$admin LISTENER_PORT=$listen EPP_ENDPOINTS="[{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $grpc}}}}]" ACCESS_LOG=/dev/null EPP_TRANSPORT_SOCKET= LISTENER_BUFFER_LIMIT= \
  envsubst <config/envoy/duplex.yaml >"$d/envoy.yaml"
"$envoy" -c "$d/envoy.yaml" --concurrency 1 -l error >"$d/envoy.log" 2>&1 &
pids+=($!)
lg=(target/release/loadgen --target "127.0.0.1:$listen" --workload random --input-len 20 --output-len 1 --model m --concurrency 4 --drain-secs 30)
# Under valgrind on a loaded machine epp can take minutes to answer its first request.
ready=0
for _ in $(seq 1 300); do
  if "${lg[@]}" --max-requests 1 --duration-secs 5 --out "$d/probe.json" >/dev/null 2>&1 && \
    python3 -c "import json,sys; sys.exit(json.load(open('$d/probe.json'))['summary']['ok'] != 1)"; then
    ready=1; break
  fi
  sleep 1
done
if ((!ready)); then
  echo "$what ($bin): no request succeeded through Envoy within the probe's limit; nothing measured (logs: $d)" >&2
  exit 1
fi
"${lg[@]}" --max-requests 200 --duration-secs 300 --out "$d/warmup.json" >"$d/warmup.log" 2>&1
callgrind_control -i on "$server" >/dev/null 2>&1
"${lg[@]}" --max-requests "$n" --duration-secs 900 --seed 9 --out "$d/run.json" >"$d/run.log" 2>&1
callgrind_control -d "$server" >/dev/null 2>&1
callgrind_control -i off "$server" >/dev/null 2>&1
ok=$(python3 -c "import json; print(json.load(open('$d/run.json'))['summary']['ok'])")
if ((ok == 0)); then
  echo "$what ($bin): every measured request failed; nothing measured (logs: $d)" >&2
  exit 1
fi
total=$(callgrind_annotate "$d/callgrind.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done=1}')
callgrind_annotate "$d/callgrind.out.1" 2>/dev/null >"$d/annotate.txt" || true
sed -n "/file:function/,\$p" "$d/annotate.txt" | head -40 >"$d/top.txt" || true
echo "$what ($bin): $ok requests, $total instructions, Ir per request $((total / ok)) (dump and top functions: $d)"
