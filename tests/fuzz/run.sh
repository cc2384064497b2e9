#!/usr/bin/env bash
# Builds the decoder fuzz target with Debian's clang (libFuzzer + ASan +
# UBSan) and runs it for N seconds (default 60) over the committed corpus.
# New inputs it finds go to a scratch directory, not into the repository;
# to grow the committed corpus: tests/fuzz/run.sh 600 --merge.
set -euo pipefail
seconds=${1:-60}
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${FUZZ_BUILD_DIR:-$root/build/fuzz}"
mkdir -p "$out"
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
src=(
  "$here/fuzz_decoders.cc"
  "$root/src/poseidon/wire/frame.cc" "$root/src/poseidon/wire/message_table.cc" "$root/src/poseidon/wire/group_payloads.cc" "$root/src/poseidon/model/layer.cc" "$root/src/poseidon/coordinator/book.cc"
  "$root/src/poseidon/coordinator/rendezvous.cc" "$root/src/poseidon/core/kv_layout.cc"
  "$root/src/poseidon/core/cost_model.cc" "$root/src/poseidon/core/best_scheme.cc" "$root/src/poseidon/kvstore/kv_shard.cc"
  "$root/src/poseidon/kvstore/adam_server.cc" "$root/src/poseidon/sfb/sufficient_factors.cc"
  "$root/src/poseidon/common/log.cc" "$root/src/poseidon/transport/security.cc"
  "$root/src/poseidon/common/trace.cc" "$root/src/poseidon/common/file.cc" "$root/src/poseidon/wire/messages.cc" "$root/src/poseidon/kvstore/server.cc"
  "$root/src/poseidon/wire/precision.cc"
  "$root/src/poseidon/sfb/keeper.cc" "$root/src/poseidon/client/syncer.cc" "$root/src/poseidon/client/syncer_send.cc" "$root/src/poseidon/kvstore/model_shard.cc"
  "$root/src/poseidon/client/fc_channel.cc"
)
flags=(-std=c++17 -O1 -g -I"$root/src" -I/usr/include/eigen3)
if [ ! -x "$out/fuzz_decoders" ] || [ -n "$(find "${src[@]}" -newer "$out/fuzz_decoders" 2>/dev/null)" ]; then
  echo "fuzz: building $out/fuzz_decoders"
  clang++ "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "${src[@]}" \
    -lzmq -lsodium -lpthread -o "$out/fuzz_decoders"
fi
corpus="$here/corpus"
if [ "${2:-}" = "--merge" ]; then
  scratch=$(mktemp -d)
  "$out/fuzz_decoders" -max_total_time="$seconds" -print_final_stats=1 "$scratch" "$corpus"
  "$out/fuzz_decoders" -merge=1 "$corpus" "$scratch"
  rm -rf "$scratch"
  exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "fuzz: running for ${seconds}s over $(ls "$corpus" | wc -l) corpus inputs"
"$out/fuzz_decoders" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$out/" "$scratch" "$corpus"
