#!/usr/bin/env bash
# Poseidon as an outside program sees it (ctest: package_consumer).
#   1. README.md's "Use it from C++" program and docs/torch.md's opening program are byte-identical to
#      examples/cpp/minimal.cc (and the README's cmake block to examples/cpp/CMakeLists.txt), so the
#      documented code is the code built and run below.
#   2. cmake --install of the build ctest runs in, into a fresh prefix: the layout, and every header an
#      installed header includes is installed too.
#   3. examples/cpp, configured with only CMAKE_PREFIX_PATH=<prefix> (find_package(Poseidon)), built and run:
#      exactness under `poseidon launch -n 4` and alone (same global batch) must end with the same
#      parameters (max |diff| / max |param| <= 1e-4); minimal runs under `poseidon launch -n 4` and alone.
#   4. add_subdirectory(<checkout>) from a tiny project: configures and generates with a target on
#      Poseidon::poseidon_torch, builds and links one on Poseidon::poseidon_core, keeps the includer's build
#      type and output directory, and turns Poseidon's tests and install rules off.
# Usage: run.sh BUILD_DIR. Works in BUILD_DIR/package-test, wiped first; a fixed path lets ccache (when the
# build uses it) reuse the examples' objects. Removed on success, kept on failure for a look.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)"
cmake="${CMAKE_COMMAND:-cmake}"
work="$build/package-test"
jobs="$(nproc 2>/dev/null || echo 2)"
start=$SECONDS
say() { echo "package: [$((SECONDS - start))s] $*"; }
fail() { echo "package: FAIL: $*" >&2; echo "package: files kept in $work" >&2; exit 1; }

# quiet LOG WHAT CMD...: CMD's output goes to $work/LOG; when it fails, the end of the log and WHAT failed.
# Programs run with a time limit, so a hang fails the test instead of stalling it.
quiet() {
  local log="$work/$1" what="$2"
  shift 2
  if ! timeout 300 "$@" > "$log" 2>&1; then
    tail -n 80 "$log" >&2
    fail "$what (log above)"
  fi
}
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
if [ "$(cache_value POSEIDON_WITH_TORCH)" = OFF ]; then
  echo "package: SKIP: this build has no LibTorch integration (POSEIDON_WITH_TORCH=OFF)"
  exit 77
fi

# ---- 1. the documented program is the example ------------------------------------------------------------
# code_block FILE HEADING LANG: the first ```LANG block after the line equal to HEADING, up to the next ```
# line; nothing when the heading or the block is missing (a "## " heading ends the search).
code_block() {
  awk -v heading="$2" -v fence="\`\`\`$3" '
    state == 0 && $0 == heading { state = 1; next }
    state == 1 && /^## / { exit }
    state == 1 && $0 == fence { state = 2; next }
    state == 2 && $0 == "```" { exit }
    state == 2 { print }' "$1"
}
rm -rf "$work"
mkdir -p "$work"
check_block() {  # DOC HEADING LANG FILE: the block must be FILE (both relative to the checkout) byte for byte
  local doc="$1" heading="$2" lang="$3" file="$4"
  code_block "$root/$doc" "$heading" "$lang" > "$work/block"
  [ -s "$work/block" ] || fail "$doc: no \`\`\`$lang block under '$heading'"
  if ! cmp -s "$work/block" "$root/$file"; then
    diff -u --label "$doc ($heading)" --label "$file" "$work/block" "$root/$file" >&2 || true
    fail "$doc: the \`\`\`$lang block under '$heading' differs from $file (copy the file verbatim)"
  fi
  say "$doc '$heading': the $lang block is $file byte for byte"
}
check_block README.md "## Use it from C++" cpp examples/cpp/minimal.cc
check_block README.md "## Use it from C++" cmake examples/cpp/CMakeLists.txt
check_block docs/torch.md "$(head -n 1 "$root/docs/torch.md")" cpp examples/cpp/minimal.cc

# ---- 2. install ----------------------------------------------------------------------------------------------
prefix="$work/prefix"
quiet install.log "cmake --install $build" "$cmake" --install "$build" --prefix "$prefix"
for f in bin/poseidon bin/poseidon-torch lib/libposeidon_core.a lib/libposeidon_torch.a lib/cmake/Poseidon/PoseidonConfig.cmake \
         lib/cmake/Poseidon/PoseidonConfigVersion.cmake lib/cmake/Poseidon/PoseidonCoreTargets.cmake \
         lib/cmake/Poseidon/PoseidonTorchTargets.cmake include/poseidon/torch/distributed.h; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done
missing=$(cd "$prefix/include" && grep -rhoE '^#include "poseidon/[^"]+"' poseidon | sed 's/.*"\(.*\)"/\1/' | sort -u |
  while read -r h; do [ -f "$h" ] || echo "$h"; done)
[ -z "$missing" ] || fail "installed headers include headers that are not installed: $missing"
say "installed into $prefix ($(find "$prefix/include" -name '*.h' | wc -l) headers)"
# The installed poseidon finds its LibTorch half beside it (cli/torch_forward.cc).
quiet train-help.log "poseidon train --help from the install" "$prefix/bin/poseidon" train --help
grep -q "usage: poseidon train" "$work/train-help.log" || fail "the installed poseidon train --help printed no usage"
say "the installed poseidon runs train in its poseidon-torch"

# ---- 3. the examples, as an outside project --------------------------------------------------------------------
# The same compiler (and compiler launcher) as Poseidon's own build: its static libraries are linked in.
consumer_flags=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=$(cache_value CMAKE_CXX_COMPILER)")
launcher="$(cache_value CMAKE_CXX_COMPILER_LAUNCHER)"
[ -z "$launcher" ] || consumer_flags+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
ex="$work/examples"
quiet examples-configure.log "configuring examples/cpp against the install" \
  "$cmake" -S "$root/examples/cpp" -B "$ex" "-DCMAKE_PREFIX_PATH=$prefix" "${consumer_flags[@]}"
found="$(sed -n 's/^Poseidon_DIR:PATH=//p' "$ex/CMakeCache.txt")"
[ "$found" = "$prefix/lib/cmake/Poseidon" ] || fail "find_package(Poseidon) found $found, not the fresh install"
quiet examples-build.log "building examples/cpp" "$cmake" --build "$ex" -j"$jobs"
say "examples/cpp configured with CMAKE_PREFIX_PATH=<prefix> and built"

# A component the package does not have is named (it said only that Poseidon_FOUND became FALSE).
mkdir -p "$work/bogus"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(bogus CXX)\nfind_package(Poseidon REQUIRED COMPONENTS bogus)\n' \
  > "$work/bogus/CMakeLists.txt"
if "$cmake" -S "$work/bogus" -B "$work/bogus/build" "-DCMAKE_PREFIX_PATH=$prefix" > "$work/bogus.log" 2>&1; then
  fail "find_package(Poseidon COMPONENTS bogus) succeeded"
fi
grep -q "Poseidon has no component 'bogus' (its components: core, torch)" "$work/bogus.log" ||
  fail "find_package(Poseidon COMPONENTS bogus) did not name the component (log: $work/bogus.log)"
say "find_package(Poseidon COMPONENTS bogus) names the missing component"

# Alone means alone: no launcher variables inherited from wherever ctest runs (a Slurm job, say).
alone=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT -u OMPI_COMM_WORLD_RANK
       -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS)
quiet exactness4.log "exactness under poseidon launch -n 4" \
  "$prefix/bin/poseidon" launch -n 4 -- "$ex/exactness" "$work/params4.bin"
quiet exactness1.log "exactness alone" "${alone[@]}" "$ex/exactness" "$work/params1.bin"
grep -E 'plan: ' "$work/exactness4.log" || true
n4=$(stat -c %s "$work/params4.bin"); n1=$(stat -c %s "$work/params1.bin")
[ "$n4" -eq "$n1" ] && [ "$n4" -gt 0 ] || fail "parameter files differ in size: $n4 and $n1 bytes"
# od prints each float32 with enough digits for a 1e-4 comparison; awk takes the maximum differences.
if od -An -v -f -w4 "$work/params4.bin" "$work/params1.bin" | grep -qiE 'nan|inf'; then
  fail "a parameter is not finite"
fi
# The verdict comes from the same awk as the number (exit status 3: over the bound), so a number that failed
# to print cannot pass; parentheses keep awk from reading ">" in a print as a redirection.
compare() {
  paste <(od -An -v -f -w4 "$work/params4.bin") <(od -An -v -f -w4 "$work/params1.bin") | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > maxd) maxd = d; a = ($2 < 0) ? -$2 : $2; if (a > maxa) maxa = a }
    END { rel = (maxa > 0) ? maxd / maxa : 1; printf("%.3g\n", rel); exit (rel <= 1e-4) ? 0 : 3 }'
}
status=0
rel=$(compare) || status=$?
say "exactness: 4 ranks x 16 rows vs 1 process x 64 rows, $((n4 / 4)) parameters: max |diff| / max |param| = $rel"
[ "$status" -eq 0 ] || fail "exactness: max |diff| / max |param| = '$rel' is over 1e-4 (awk exit $status)"

quiet minimal4.log "minimal under poseidon launch -n 4" "$prefix/bin/poseidon" launch -n 4 -- "$ex/minimal"
quiet minimal1.log "minimal alone" "${alone[@]}" "$ex/minimal"
say "minimal: ran under poseidon launch -n 4 and alone; $(tail -n 1 "$work/minimal4.log")"

# The Python package, when built: installed beside the rest, importable from the prefix alone.
if [ -d "$build/python/poseidon" ]; then
  site="$prefix/lib/python3/dist-packages"
  [ -f "$site/poseidon/__init__.py" ] || fail "the install has no Python package under $site"
  quiet python-import.log "import poseidon from the install" env PYTHONPATH="$site" "${alone[@]}" /usr/bin/python3 -c \
    "import poseidon, torch; m = poseidon.DistributedModel(torch.nn.Linear(3, 2), batch=2); m.finish(); print(poseidon.__file__)"
  say "python: $(tail -n 1 "$work/python-import.log")"
fi

# ---- 4. add_subdirectory --------------------------------------------------------------------------------------
sub="$work/subdir"
mkdir -p "$sub"
cat > "$sub/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(includer LANGUAGES CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY \${PROJECT_BINARY_DIR}/includer-bin)
add_subdirectory("$root" poseidon)
add_executable(app app.cc)
target_link_libraries(app PRIVATE Poseidon::poseidon_core)
# Not built (the test builds only app), but generating it evaluates LibTorch's usage requirements from this
# directory, which fails when Poseidon's find_package(Torch) targets are not visible here.
add_executable(app_torch EXCLUDE_FROM_ALL app.cc)
target_link_libraries(app_torch PRIVATE Poseidon::poseidon_torch)
# Where Poseidon's own executable would go, without building it.
file(GENERATE OUTPUT \${PROJECT_BINARY_DIR}/poseidon-location.txt CONTENT "\$<TARGET_FILE:poseidon>")
CMAKE
cat > "$sub/app.cc" <<'CC'
#include "poseidon/core/best_scheme.h"
int main() { return poseidon::schemeName(poseidon::Scheme::kSFB)[0] == 's' ? 0 : 1; }
CC
# No build type: the includer's choice must stand (Poseidon sets Release only for itself at the top), and
# unoptimized the core compiles in half the time. Only the core is built.
sub_flags=("-DCMAKE_CXX_COMPILER=$(cache_value CMAKE_CXX_COMPILER)" -DCMAKE_BUILD_TYPE=)
[ -z "$launcher" ] || sub_flags+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
quiet subdir-configure.log "configuring a project that does add_subdirectory(poseidon)" \
  "$cmake" -S "$sub" -B "$sub/build" "${sub_flags[@]}"
sub_cache() { sed -n "s/^$1:[A-Z]*=//p" "$sub/build/CMakeCache.txt"; }
[ "$(sub_cache POSEIDON_BUILD_TESTS)" = OFF ] || fail "add_subdirectory: POSEIDON_BUILD_TESTS is not OFF by default"
[ "$(sub_cache POSEIDON_INSTALL)" = OFF ] || fail "add_subdirectory: POSEIDON_INSTALL is not OFF by default"
if grep -q -- '-O3' "$sub/build/poseidon/CMakeFiles/poseidon_core.dir/flags.make"; then
  fail "add_subdirectory: Poseidon set its own build type (Release) under an includer that chose none"
fi
location="$(cat "$sub/build/poseidon-location.txt")"
case "$location" in
  "$sub/build/includer-bin/"*) ;;
  *) fail "add_subdirectory: the poseidon command would go to $location, not the includer's output directory" ;;
esac
quiet subdir-build.log "building a project that does add_subdirectory(poseidon)" \
  "$cmake" --build "$sub/build" --target app -j"$jobs"
"$sub/build/includer-bin/app" || fail "add_subdirectory: the linked program failed"
say "add_subdirectory: generated with Poseidon::poseidon_torch, linked Poseidon::poseidon_core and ran;" \
  "tests and install off, build type and output directory kept"

rm -rf "$work"
say "PASS"
