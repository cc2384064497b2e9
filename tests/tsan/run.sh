#!/usr/bin/env bash
# Builds the core tests (no LibTorch) with ThreadSanitizer and runs them; any
# report fails the run (exit code 66). Run by ctest as tsan_core_tests; by hand:
#   bash tests/tsan/run.sh [--gtest_filter=...]
# libzmq is not instrumented: see suppressions.txt for what that costs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${TSAN_BUILD_DIR:-$root/build/tsan}"
echo "tsan: building core_tests with -fsanitize=thread in $out"
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOSEIDON_TSAN=ON -DPOSEIDON_WITH_TORCH=OFF \
  -DPOSEIDON_NATIVE=OFF >/dev/null
cmake --build "$out" -j"$(nproc)" --target core_tests 2>&1 | grep -E "error|warning: ThreadSanitizer" || true
test -x "$out/bin/core_tests"
export TSAN_OPTIONS="suppressions=$here/suppressions.txt halt_on_error=1 exitcode=66 second_deadlock_stack=1"
# The planner's tests are left out: its discrete-event models run on the calling thread alone (no
# thread, lock or atomic in src/poseidon/planner/), so ThreadSanitizer has nothing to check there,
# and they were 178 of the run's 237 s under it (2026-12-05, 2 cores). A --gtest_filter given to
# this script comes after this one and replaces it.
echo "tsan: running core_tests (without the single-threaded Planner.*)"
"$out/bin/core_tests" --gtest_brief=1 --gtest_filter='-Planner.*' "$@"
