#!/bin/bash
# Issue 32's runs that need more cores than the 2 of the development machine: the emulated cluster at
# 16 and 32 nodes, and resnet-152's 8-node points whose smaller receive buffers make this machine's
# host HOST-BOUND (bench/results/resnet152_tail/). For the GPU machine of ../shared/gpu/README.md (16
# cores, root; iproute2, ZeroMQ and libsodium come in .device/, pip torch is its python3). Its GPU is
# not used: every GPU here is emulated (docs/bench.md).
#
#   scripts/device-check.sh --prepare   here first (fills .device/, which must travel along)
#   scripts/device-scale.sh [OUT]       there: builds bin/poseidon against the machine's torch, then, most
#                                       wanted first, each step with a limit under DEVICE_CHECK_SECONDS:
#     1. vgg19, 32 nodes, 30 Mbit/s: poseidon and poseidon-overlap, 16 KB receive buffers (the scale
#        sweep's), 3 runs each: the issue asks both within 1.15x of their own bound, host CPU reported
#     2. resnet-152, 8 nodes, 30 Mbit/s, the 16-bit wire: poseidon-overlap-bf16 with the OS's receive
#        buffer, 12 KB and 8 KB, against ddp-fp16 (in the machine's python3), 3 runs each: the issue asks
#        1.2x over ddp-fp16
#     3. vgg19, 16 nodes, 30 Mbit/s: poseidon-overlap as in 1, 3 runs: the issue asks 1.10x
# It prints one table (median s/iter of 3, / own bound, host CPU, HOST-BOUND, DDP-fp16 / it) and leaves
# each step's bench JSON, Markdown and log under OUT (default /tmp/device-scale). For a dry run on a
# smaller machine: VGG_NODES="4 2" (instead of "32 16") and REPEAT=1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-/tmp/device-scale}
mkdir -p "$OUT"
BUILD=${BUILD:-/tmp/poseidon-device-build}
PY=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
read -r VGG_BIG VGG_MID <<<"${VGG_NODES:-32 16}"

[[ -f .device/device-env.sh ]] || { echo "device-scale: no .device/ here: run scripts/device-check.sh --prepare first"; exit 2; }
DEBS=.device/debs source .device/device-env.sh
END=$(( ${DEVICE_CHECK_SECONDS:-100000} - 20 ))
lim() {  # as in device-check.sh: no step runs past END
  local s=$1 left=$((END - SECONDS)); shift
  (( left < 5 )) && { echo "device-scale: no time left for: $*"; return 124; }
  (( s > left )) && s=$left
  timeout --kill-after=10 "$s" "$@"
}

# Only the CLI: the tests and the Python package are device-check.sh's.
if ! { cmake -S . -B "$BUILD" "${POSEIDON_DEVICE_CMAKE_ARGS[@]}" -DPOSEIDON_WITH_PYTHON=OFF >"$OUT/configure.log" 2>&1 &&
  lim 400 cmake --build "$BUILD" -j"$(nproc)" --target poseidon >"$OUT/build.log" 2>&1; }; then
  tail -n 30 "$OUT/configure.log" "$OUT/build.log"
  echo "device-scale: the build failed (logs in $OUT)"
  exit 1
fi
echo "device-scale: built in ${SECONDS} s on $(nproc) cores"
BIN=$BUILD/bin/poseidon
export POSEIDON_SOURCE=$ROOT

bench() {  # name, limit, bench flags...
  local name=$1 s=$2; shift 2
  lim "$s" "$BIN" bench --rates 30 --repeat "$REPEAT" --json "$OUT/$name.json" --markdown "$OUT/$name.md" "$@" \
    >"$OUT/$name.log" 2>&1
  echo "device-scale: $name exit $? at ${SECONDS} s"
}
common=(--iterations 4 --warmup 2 --run-timeout 400)
bench vgg19-$VGG_BIG 300 --models vgg19 --systems poseidon,poseidon-overlap --nodes "$VGG_BIG" \
  --tcp-rcvbuf 16384 "${common[@]}"
bench resnet152-os 200 --models resnet-152 --systems poseidon-overlap-bf16,ddp-fp16 --nodes 8 \
  --ddp-python "$(command -v "$PY")"
bench resnet152-12k 120 --models resnet-152 --systems poseidon-overlap-bf16 --nodes 8 --tcp-rcvbuf 12288
bench resnet152-8k 120 --models resnet-152 --systems poseidon-overlap-bf16 --nodes 8 --tcp-rcvbuf 8192
bench vgg19-$VGG_MID 150 --models vgg19 --systems poseidon-overlap --nodes "$VGG_MID" --tcp-rcvbuf 16384 "${common[@]}"

$PY - "$OUT" "vgg19-$VGG_BIG" resnet152-os resnet152-12k resnet152-8k "vgg19-$VGG_MID" <<'EOF'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
ddp = None
rows = []
for name in names:
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        rows.append((name, "-", "no results (%s.log)" % name, "", "", "", ""))
        continue
    for r in json.load(open(path))["runs"]:
        if r["system"] == "ddp-fp16":
            ddp = r["iteration_seconds"] if r.get("ok") else None
        rows.append((name, "%s %d nodes" % (r["system"], r["nodes"]),
                     "%.3f (%.3f-%.3f)" % (r["iteration_seconds"], r["min_seconds"], r["max_seconds"]) if r.get("ok")
                     else "failed: " + r.get("error", "")[:40],
                     "%.2f" % r["measured_over_own_bound"] if r.get("ok") else "",
                     "%.0f%%" % (100 * r["host_cpu_share"]) if r.get("host_cpu_share") is not None else "",
                     "HOST-BOUND" if r.get("host_bound") else "",
                     r["iteration_seconds"] if r.get("ok") and r["system"].startswith("poseidon") else None))
print("\ndevice scale (%d cores, %d runs a point, 30 Mbit/s = 3 Gbit/s at full width)" % (os.cpu_count(), int(os.environ.get("REPEAT", "3"))))
print("%-16s %-32s %-24s %-10s %-6s %-11s %s" % ("step", "system", "s/iter (min-max)", "/ own bound", "host", "", "ddp-fp16 / it"))
for step, system, secs, bound, host, hb, it in rows:
    vs = "%.2fx" % (ddp / it) if ddp and it and step.startswith("resnet") else ""
    print("%-16s %-32s %-24s %-10s %-6s %-11s %s" % (step, system, secs, bound, host, hb, vs))
EOF
echo "device-scale: ${SECONDS} s"
