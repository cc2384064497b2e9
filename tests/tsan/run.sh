#!/usr/bin/env bash
# Builds the core tests (no LibTorch) with ThreadSanitizer and runs them; any
# report fails the run (exit code 66). Run by ctest as tsan_core_tests; by hand:
#   bash tests/tsan/run.sh [--gtest_filter=...]
# libzmq is not instrumented: see suppressions.txt for what that costs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${TSAN_BUILD_DIR:-$root/build/tsan}"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
echo "tsan: building core_tests with -fsanitize=thread in $out"
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOSEIDON_TSAN=ON -DPOSEIDON_WITH_TORCH=OFF \
  -DPOSEIDON_NATIVE=OFF "${launcher[@]}" >/dev/null
cmake --build "$out" -j"$(nproc)" --target core_tests 2>&1 | grep -E "error|warning: ThreadSanitizer" || true
test -x "$out/bin/core_tests"
export TSAN_OPTIONS="suppressions=$here/suppressions.txt halt_on_error=1 exitcode=66 second_deadlock_stack=1"
echo "tsan: running core_tests"
"$out/bin/core_tests" --gtest_brief=1 "$@"
