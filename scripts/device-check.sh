#!/bin/bash
# The GPU check of docs/gpu.md: what only a machine with an NVIDIA GPU can show. For the machine that
# ../shared/gpu/README.md describes (pip torch 2.x with CUDA as python3, CMake, ninja, g++, no package
# registry, no ZeroMQ, libsodium, gtest or iproute2).
#
#   scripts/device-check.sh --prepare   here, on a machine with Debian's registry: fills .device/ (the
#                                       Debian packages the GPU machine lacks, their environment, the
#                                       data set) and keeps it out of git; .device must travel along
#   scripts/device-check.sh [OUT]       there: builds against the machine's torch, runs the core and
#                                       torch tests, then on the GPU
#     (a) exactness: 4 ranks sharing the GPU x 16 rows against one process x 64 rows on the CPU, 10 steps
#         of SGD with momentum, for an MLP, a model with a never-called SFB layer and a conv net with
#         BatchNorm (against the same 4 ranks on the CPU: its batch statistics are per rank); in C++
#         (torch_tests' DeviceExactness) and in Python (tests/python/jobs/exact_job.py); max rel diff <= 1e-4;
#         and the same in C++ as 2 machines x 2 local ranks (torch_tests' LocalRanks, --local-ranks 2)
#     the README's Python example with only .cuda() added (model and data), 4 ranks, and its C++ example with
#         the model and data moved by selectDevice("cuda", LOCAL_RANK), built against this build's install
#     (b) the main job with --device cuda: test accuracy >= 88%
#     (c) a trace whose device-to-host copies run inside the backward (a copy done before the step's last
#         layer's backward is)
#     (e) merged FC with the model on the GPU: 1 epoch, 2 groups, its accuracy within 2 points of the CPU's
#     (d) per-iteration time of DistributedModel with 1 rank against the plain loop (--plain), and
#         images/s with 4 ranks
# It prints one table, writes its logs under OUT (default /tmp/device-check) and exits non-zero on any miss.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [[ "${1:-}" == "--prepare" ]]; then
  set -e
  SHARED=${SHARED:-$ROOT/../shared/gpu}
  bash "$SHARED/fetch-debs.sh" .device/debs
  cp "$SHARED/device-env.sh" .device/
  mkdir -p .device/data
  cp /usr/share/datasets/fashion-mnist/*.gz .device/data/
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
  echo "device-check: .device/ prepared ($(du -sh .device | cut -f1)); run scripts/device-check.sh on the GPU machine"
  exit 0
fi

OUT=${1:-/tmp/device-check}
mkdir -p "$OUT"
BUILD=${BUILD:-/tmp/poseidon-device-build}
PY=${PYTHON:-python3}
declare -a ROWS
FAILED=0
row() {  # check, result, verdict
  ROWS+=("$(printf '%-52s %-36s %s' "$1" "$2" "$3")")
  [[ "$3" == ok ]] || FAILED=1
}
table() {
  echo
  echo "device check ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null))"
  printf '%-52s %-36s %s\n' check result verdict
  for r in "${ROWS[@]}"; do echo "$r"; done
}
trap table EXIT

[[ -f .device/device-env.sh ]] || { echo "device-check: no .device/ here: run scripts/device-check.sh --prepare first"; exit 2; }
DEBS=.device/debs source .device/device-env.sh
PYBIND=${PYBIND11_DIR:-}; [[ -n "$PYBIND" ]] || PYBIND=$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null || true)

# ---- build against this machine's torch ----
# -k 0: every compile error in one pass (time on the machine is short); what did build still runs.
configure_ok=0
cmake -S . -B "$BUILD" "${POSEIDON_DEVICE_CMAKE_ARGS[@]}" -DPython_EXECUTABLE="$(command -v $PY)" \
  ${PYBIND:+-Dpybind11_DIR=$PYBIND} -DPOSEIDON_WITH_PYTHON=$([[ -n "$PYBIND" ]] && echo ON || echo OFF) \
  >"$OUT/configure.log" 2>&1 && configure_ok=1
if [[ $configure_ok == 1 ]] && cmake --build "$BUILD" -j"$(nproc)" -- -k 0 >"$OUT/build.log" 2>&1; then
  row "build against pip torch" "$(grep -c '' "$OUT/build.log") lines of log, ${SECONDS} s" ok
else
  row "build against pip torch" "$(grep -c 'error:' "$OUT/build.log" 2>/dev/null) errors (build.log)" MISS
  [[ $configure_ok == 1 ]] || tail -30 "$OUT/configure.log"
  grep -E 'error:|FAILED:' "$OUT/build.log" 2>/dev/null | head -60
  [[ -x "$BUILD/bin/poseidon" ]] || exit 1
fi
BIN=$BUILD/bin
export POSEIDON_CLI=$BIN/poseidon POSEIDON_PYTHONPATH=$BUILD/python POSEIDON_SOURCE=$ROOT
# A Python rank that crashes prints its traceback, then the C++ stack (common/crash.h).
export PYTHONFAULTHANDLER=1
# Each step has a limit, so one hang costs that step, not the machine's whole lease; and none runs past
# DEVICE_CHECK_SECONDS from the start (the lease's limit), so the table and the logs always come out.
END=$(( ${DEVICE_CHECK_SECONDS:-100000} - 20 ))
lim() {
  local s=$1 left=$((END - SECONDS)); shift
  (( left < 5 )) && { echo "device-check: no time left for: $*"; return 124; }
  (( s > left )) && s=$left
  timeout --kill-after=5 "$s" "$@"
}

# ---- what the processes load: one OpenMP runtime, one LibTorch ----
{
  echo "== ldd poseidon"; ldd "$BIN/poseidon" | grep -Ei 'omp|torch|c10|zmq|sodium|stdc'
  echo "== the compiler's libstdc++ and what the binaries need, in order"
  ls "$(dirname "$(dirname "$(command -v "${CXX:-g++}")")")"/lib64/libstdc++* 2>&1 | head -5
  readelf -d "$BIN/poseidon" | grep NEEDED | head -8
  echo "symbols the Python module exports: $(nm -D --defined-only "$BUILD"/python/poseidon/_poseidon*.so 2>/dev/null | wc -l)"
  echo "== python after import torch, poseidon"
  PYTHONPATH=$BUILD/python $PY -c 'import torch, poseidon; print(torch.__version__, torch.version.cuda, torch.cuda.is_available()); print("\n".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if any(k in l for k in ("omp", "_poseidon", "libtorch", "libc10", "stdc++", "zmq"))})))'
} >"$OUT/libs.log" 2>&1
omps=$(grep -A100 '^== python' "$OUT/libs.log" | grep -Ec 'omp[^/]*\.so')
row "OpenMP runtimes in a Python rank" "$omps ($(grep -A100 '^== python' "$OUT/libs.log" | grep -Eo '[^/]*omp[^/]*\.so[^/]*' | paste -sd' '))" \
  "$([[ $omps -le 1 ]] && echo ok || echo MISS)"

# ---- the core and torch tests (the emulated-cluster ones need root and iproute2: left to CI) ----
# The data set's tests read it where Debian's package puts it.
if [[ ! -e /usr/share/datasets/fashion-mnist ]]; then
  mkdir -p /usr/share/datasets && ln -s "$ROOT/.device/data" /usr/share/datasets/fashion-mnist
fi
lim 180 "$BIN/core_tests" --gtest_brief=1 >"$OUT/core_tests.log" 2>&1
core_rc=$?
row "core tests" "$(grep -Eo 'PASSED.*|[0-9]+ FAILED TESTS?' "$OUT/core_tests.log" | tail -1)" \
  "$([[ $core_rc == 0 ]] && echo ok || echo MISS)"
lim 300 stdbuf -oL "$BIN/torch_tests" --gtest_brief=1 \
  --gtest_filter='DistributedModel.*:*DdpSemantics*:DeviceExactness.*:Devices.*:Checkpoint.*:LocalRanks.*:DeviceStragglers.*' >"$OUT/torch_tests.log" 2>&1
torch_rc=$?
row "torch tests (DistributedModel, DDP semantics, devices)" "$(grep -Eo 'PASSED.*|[0-9]+ FAILED TESTS?' "$OUT/torch_tests.log" | tail -1)" \
  "$([[ $torch_rc == 0 ]] && echo ok || echo MISS)"

# ---- (a) exactness on the GPU ----
for kind in mlp unused bnconv; do
  d=$(grep -Eo "device-exactness $kind on cuda[0-9:]*: max rel diff [0-9.e+-]+" "$OUT/torch_tests.log" | grep -Eo '[0-9.e+-]+$')
  row "(a) C++ $kind, 4 ranks on the GPU" "max rel diff ${d:-none}" \
    "$([[ -n "$d" ]] && $PY -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" && echo ok || echo MISS)"
done
# Several GPUs in one node (--local-ranks 2: 2 machines x 2 ranks, each pair meeting on its leader).
for kind in mlp unused bnconv; do
  d=$(grep -Eo "local-ranks 2 $kind on cuda[0-9:]*: max rel diff [0-9.e+-]+" "$OUT/torch_tests.log" | grep -Eo '[0-9.e+-]+$')
  row "(a) C++ $kind, 2 x 2 local ranks on the GPU" "max rel diff ${d:-none}" \
    "$([[ -n "$d" ]] && $PY -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" && echo ok || echo MISS)"
done
if [[ -n "$PYBIND" ]]; then
  JOB=$ROOT/tests/python/jobs/exact_job.py
  for kind in mlp unused bnconv; do
    PYTHONPATH=$BUILD/python lim 120 "$BIN/poseidon" launch -n 4 -- $PY "$JOB" $kind "$OUT/$kind-gpu.pt" --device cuda \
      >"$OUT/$kind-gpu.log" 2>&1
    if [[ $kind == bnconv ]]; then
      PYTHONPATH=$BUILD/python lim 120 "$BIN/poseidon" launch -n 4 -- $PY "$JOB" $kind "$OUT/$kind-ref.pt" >"$OUT/$kind-ref.log" 2>&1
    else
      PYTHONPATH=$BUILD/python lim 120 $PY "$JOB" $kind "$OUT/$kind-ref.pt" >"$OUT/$kind-ref.log" 2>&1
    fi
    d=$($PY - "$OUT/$kind-gpu.pt" "$OUT/$kind-ref.pt" <<'EOF' 2>>"$OUT/$kind-gpu.log"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print("%.3g" % max(((p - q).abs().max() / q.abs().max().clamp(min=1e-6)).item() for p, q in zip(a["params"], b["params"])))
EOF
)
    row "(a) Python $kind, 4 ranks on the GPU" "max rel diff ${d:-none (see $kind-gpu.log)}" \
      "$([[ -n "$d" ]] && $PY -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" && echo ok || echo MISS)"
  done
else
  row "(a) Python exactness" "no pybind11 for $PY" MISS
fi

# ---- the README's Python example with the model and the data moved to the GPU, nothing else changed ----
if [[ -n "$PYBIND" ]]; then
  $PY - "$ROOT/examples/python/minimal.py" "$OUT/minimal_cuda.py" <<'EOF'
import sys
text = open(sys.argv[1]).read()
for old, new in (("torch.nn.Linear(128, 4))", "torch.nn.Linear(128, 4)).cuda()"),
                 ("y = x[:, :4].argmax(1)", "y = x[:, :4].argmax(1)\nx, y = x.cuda(), y.cuda()")):
    assert old in text, old
    text = text.replace(old, new, 1)
open(sys.argv[2], "w").write(text)
EOF
  PYTHONPATH=$BUILD/python lim 120 "$BIN/poseidon" launch -n 4 -- $PY "$OUT/minimal_cuda.py" >"$OUT/minimal.log" 2>&1
  ex_rc=$?
  done_ranks=$(grep -c "step 100 loss" "$OUT/minimal.log")
  row "README Python example + .cuda(), 4 ranks" "exit $ex_rc, $done_ranks ranks at step 100" \
    "$([[ $ex_rc == 0 && $done_ranks == 4 ]] && echo ok || echo MISS)"
  # The same example unchanged, on the CPU: where pip torch 2.11 once killed rank 0 with SIGSEGV.
  PYTHONPATH=$BUILD/python lim 120 "$BIN/poseidon" launch -n 4 -- $PY "$ROOT/examples/python/minimal.py" >"$OUT/minimal_cpu.log" 2>&1
  ex_rc=$?
  done_ranks=$(grep -c "step 100 loss" "$OUT/minimal_cpu.log")
  row "README Python example on the CPU, 4 ranks" "exit $ex_rc, $done_ranks ranks at step 100" \
    "$([[ $ex_rc == 0 && $done_ranks == 4 ]] && echo ok || echo MISS)"
fi

# ---- the README's C++ example with the model and the data moved to the GPU, nothing else changed:
# built as an outside project against this build's install (find_package(Poseidon)) and launched by
# the installed poseidon, as the README says. The install and the example's build stay out of OUT
# (only its log comes back). EXAMPLE_DEVICE=cpu tries the same steps on a machine without a GPU. ----
PREFIX=$BUILD-install EX=$BUILD-example
rm -rf "$PREFIX" "$EX"
mkdir -p "$EX"
cp "$ROOT/examples/cpp/CMakeLists.txt" "$ROOT/examples/cpp/exactness.cc" "$EX/"
$PY - "$ROOT/examples/cpp/minimal.cc" "$EX/minimal.cc" "${EXAMPLE_DEVICE:-cuda}" <<'EOF'
import sys
text = open(sys.argv[1]).read()
device = sys.argv[3]
for old, new in (('#include "poseidon/torch/distributed.h"\n',
                  '#include "poseidon/torch/distributed.h"\n#include "poseidon/torch/device_staging.h"\n'),
                 ("  Mlp net;\n",
                  "  Mlp net;\n"
                  "  const auto device = poseidon::pt::selectDevice(\"%s\", poseidon::rankFromEnvironment().localRank);\n"
                  "  net->to(device);\n  x = x.to(device);\n  y = y.to(device);\n" % device)):
    assert old in text, old
    text = text.replace(old, new, 1)
open(sys.argv[2], "w").write(text)
EOF
ex_args=()
for a in "${POSEIDON_DEVICE_CMAKE_ARGS[@]}"; do
  [[ $a == -DCMAKE_PREFIX_PATH=* ]] && a="-DCMAKE_PREFIX_PATH=$PREFIX;${a#-DCMAKE_PREFIX_PATH=}"
  ex_args+=("$a")
done
[[ " ${ex_args[*]} " == *" -DCMAKE_PREFIX_PATH="* ]] || ex_args+=("-DCMAKE_PREFIX_PATH=$PREFIX")
ex_rc=1
if lim 120 cmake --install "$BUILD" --prefix "$PREFIX" >"$OUT/example_cpp.log" 2>&1 &&
  lim 120 cmake -S "$EX" -B "$EX/build" "${ex_args[@]}" >>"$OUT/example_cpp.log" 2>&1 &&
  lim 240 cmake --build "$EX/build" -j"$(nproc)" --target minimal >>"$OUT/example_cpp.log" 2>&1; then
  (cd "$EX" && lim 120 "$PREFIX/bin/poseidon" launch -n 4 -- ./build/minimal) >>"$OUT/example_cpp.log" 2>&1
  ex_rc=$?
fi
done_ranks=$(grep -c "step 100 loss" "$OUT/example_cpp.log")
row "README C++ example on ${EXAMPLE_DEVICE:-cuda}, 4 ranks" "exit $ex_rc, $done_ranks ranks at step 100" \
  "$([[ $ex_rc == 0 && $done_ranks == 4 ]] && echo ok || echo MISS)"

# ---- (b) the main job on the GPU ----
lim 300 "$BIN/poseidon" train --device cuda --data .device/data --summary "$OUT/main.json" >"$OUT/main.log" 2>&1
acc=$($PY -c "import json; print('%.4f' % json.load(open('$OUT/main.json'))['test_accuracy'])" 2>/dev/null)
secs=$($PY -c "import json; print('%.1f' % json.load(open('$OUT/main.json'))['wall_seconds'])" 2>/dev/null)
row "(b) main job --device cuda (4 workers, 5 epochs)" "accuracy ${acc:-none} in ${secs:-?} s" \
  "$([[ -n "$acc" ]] && $PY -c "import sys; sys.exit(0 if $acc >= 0.88 else 1)" && echo ok || echo MISS)"

# ---- (e) merged FC with a CUDA model: the FC server's classifier on the GPU, the features and their
# gradient through host memory; against the same job on the CPU (2 groups are asynchronous, so not
# bit for bit: a lost update or a wrong scaling costs far more than 2 points in one epoch) ----
for dev in cuda cpu; do
  lim 180 "$BIN/poseidon" train --device $dev --data .device/data --groups 2 --merged-fc --epochs 1 \
    --summary "$OUT/merged-$dev.json" --quiet >"$OUT/merged-$dev.log" 2>&1
done
mg=$($PY -c "import json; print('%.4f' % json.load(open('$OUT/merged-cuda.json'))['test_accuracy'])" 2>/dev/null)
mc=$($PY -c "import json; print('%.4f' % json.load(open('$OUT/merged-cpu.json'))['test_accuracy'])" 2>/dev/null)
row "(e) merged FC, 2 groups, 1 epoch: cuda vs cpu" "accuracy ${mg:-none} vs ${mc:-none}" \
  "$([[ -n "$mg" && -n "$mc" ]] && $PY -c "import sys; sys.exit(0 if $mg >= 0.80 and abs($mg - $mc) <= 0.02 else 1)" && echo ok || echo MISS)"

# ---- (c) the copies inside the backward ----
lim 120 "$BIN/poseidon" train --device cuda --data .device/data --workers 2 --max-steps 30 --trace "$OUT/trace.json" \
  --quiet >"$OUT/trace.log" 2>&1
inside=$($PY - "$OUT/trace.json" <<'EOF' 2>>"$OUT/trace.log"
import collections, json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
copies, backward = collections.defaultdict(list), collections.defaultdict(list)
for e in events:
    key = (e["pid"], e.get("args", {}).get("iteration", -1))
    if e["tid"] == 3 and e["name"].startswith("copy "):
        copies[key].append(e)
    elif e["tid"] == 0 and e["name"].startswith("backward "):
        backward[key].append(e)
steps = [k for k in copies if k in backward]
inside = sum(1 for k in steps if min(c["ts"] + c["dur"] for c in copies[k]) < max(b["ts"] + b["dur"] for b in backward[k]))
print("%d/%d" % (inside, len(steps)))
EOF
)
row "(c) a copy done before the step's backward is" "${inside:-none} steps" \
  "$([[ -n "$inside" && "${inside%%/*}" -gt 0 ]] && echo ok || echo MISS)"

# ---- (d) overhead and throughput ----
lim 120 "$BIN/poseidon" train --device cuda --data .device/data --plain --workers 1 --epochs 1 --summary "$OUT/plain.json" \
  --quiet >"$OUT/plain.log" 2>&1
lim 120 "$BIN/poseidon" train --device cuda --data .device/data --workers 1 --epochs 1 --summary "$OUT/one.json" \
  --quiet >"$OUT/one.log" 2>&1
lim 120 "$BIN/poseidon" train --device cuda --data .device/data --workers 4 --epochs 1 --summary "$OUT/four.json" \
  --quiet >"$OUT/four.log" 2>&1
per_step() { $PY -c "import json; s = json.load(open('$1')); print('%.2f' % (1000 * s['train_seconds'] / s['steps']))" 2>/dev/null; }
plain=$(per_step "$OUT/plain.json"); one=$(per_step "$OUT/one.json")
four=$($PY -c "import json; print('%.0f' % json.load(open('$OUT/four.json'))['images_per_sec'])" 2>/dev/null)
row "(d) ms/iteration: plain loop vs DistributedModel" "${plain:-?} vs ${one:-?}" "$([[ -n "$plain" && -n "$one" ]] && echo ok || echo MISS)"
row "(d) images/s with 4 ranks on the GPU" "${four:-?}" "$([[ -n "$four" ]] && echo ok || echo MISS)"

# ---- the emulated cluster, its smallest run: where pip torch 2.11 once ended bench with SIGSEGV ----
lim 180 "$BIN/poseidon" bench --models alexnet --systems poseidon --nodes 2 --rates 1000 --iterations 2 --warmup 1 \
  --retries 0 --run-timeout 90 --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
bench_rc=$?
row "bench, alexnet on 2 emulated nodes" "exit $bench_rc, $([[ -s "$OUT/bench.json" ]] && echo results || echo 'no results')" \
  "$([[ $bench_rc == 0 && -s "$OUT/bench.json" ]] && echo ok || echo MISS)"

# ---- every crash report, its frames turned into functions and lines ----
for log in "$OUT"/*.log; do
  grep -q "fatal signal" "$log" || continue
  echo "== $log"
  grep -A64 "fatal signal" "$log" | grep -Eo '/[^ (]+\(\+0x[0-9a-f]+\)' | sort -u | while read -r frame; do
    bin=${frame%%(*}; off=${frame#*(+}; off=${off%)}
    echo "$frame -> $(addr2line -f -C -i -e "$bin" "$off" 2>/dev/null | paste -sd' ')"
  done
done >"$OUT/crashes.txt" 2>&1
crashes=$(grep -c '^== ' "$OUT/crashes.txt")
row "logs with a crash report" "$crashes (crashes.txt)" "$([[ $crashes == 0 ]] && echo ok || echo MISS)"
echo "device-check: ${SECONDS} s"
exit $FAILED
