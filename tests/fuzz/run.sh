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
flags=(-std=c++17 -O1 -g -I"$root/src" -I/usr/include/eigen3 -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined)
# One object per source, compiled in parallel, through ccache where it is installed (then every run
# rebuilds, and an unchanged source is a cache lookup: CCACHE_BASEDIR keeps another clone's paths out of
# the key). Without ccache, a rebuild only when a source is newer than the program, as before.
if command -v ccache >/dev/null || [ ! -x "$out/fuzz_decoders" ] ||
   [ -n "$(find "${src[@]}" -newer "$out/fuzz_decoders" 2>/dev/null)" ]; then
  echo "fuzz: building $out/fuzz_decoders"
  cc=(clang++)
  if command -v ccache >/dev/null; then cc=(env CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true ccache clang++); fi
  mkdir -p "$out/obj"
  objects=()
  for f in "${src[@]}"; do objects+=("$out/obj/$(basename "$(dirname "$f")")_$(basename "$f" .cc).o"); done
  for i in "${!src[@]}"; do printf '%s\0%s\0' "${src[$i]}" "${objects[$i]}"; done |
    xargs -0 -n 2 -P "$(nproc 2>/dev/null || echo 2)" \
      bash -c 'n=$#; exec "${@:1:n-2}" -c "${@:n-1:1}" -o "${@:n:1}"' compile "${cc[@]}" "${flags[@]}"
  clang++ "${flags[@]}" "${objects[@]}" -lzmq -lsodium -lpthread -o "$out/fuzz_decoders"
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
