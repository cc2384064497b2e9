#!/usr/bin/env bash
# Installs everything Poseidon needs from Debian bookworm's packages.
# Run as root (or with sudo). Safe to run again: apt skips what is installed.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (sudo bash scripts/setup.sh): it installs Debian packages" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
PACKAGES=(
  build-essential cmake pkg-config git
  libzmq3-dev cppzmq-dev          # transport (ZeroMQ)
  libsodium-dev                   # job secret: CURVE key derivation
  libeigen3-dev                   # SFB reconstruction GEMM
  nlohmann-json3-dev zlib1g-dev   # JSON output, gzip'd dataset
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev                    # LibTorch integration (CPU build)
  libopenblas0-openmp             # torch's BLAS: without it Debian's torch runs the reference BLAS
                                  # (LeNet's fc layer 40x slower); the OpenMP build shares torch's threads
  dataset-fashion-mnist           # the main job's data
  python3-torch                   # the Python package's torch, and the PyTorch DDP baseline of poseidon bench
  python3-dev pybind11-dev        # the Python package (poseidon._poseidon)
  iproute2                        # network namespaces + tc for the emulated cluster
  gnuplot-nox                     # bench plots
  clang libclang-rt-14-dev        # libFuzzer for the decoder fuzz test
  ccache                          # rebuilds of unchanged sources (CMakeLists.txt: POSEIDON_CCACHE)
)
echo "setup.sh: apt-get update"
apt-get update -qq
echo "setup.sh: installing ${#PACKAGES[@]} packages (already installed ones are skipped)"
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
# torch's libblas.so.3 is OpenBLAS's OpenMP build even if another provider (the pthread build ranks
# higher) is installed later: it runs on torch's thread count instead of starting its own threads.
update-alternatives --quiet --set libblas.so.3-x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
echo "setup.sh: done"
