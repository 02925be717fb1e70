#!/usr/bin/env bash
# Build the native reference engine (llama.cpp) for side-by-side benchmarks: llama-bench, llama-server and
# llama-completion, from a copy fetched OUTSIDE this repository at a pinned commit, tuned for this CPU
# (-DGGML_NATIVE=ON, Release). Never run by CI or `make test`; its code never enters the repository.
#
#   benchmarks/build_reference.sh [DIR]        # default DIR: ~/.cache/llamacy/reference/llama.cpp
#   LLAMA_CPP_COMMIT=<sha> benchmarks/build_reference.sh
#   LLAMA_CPP_CMAKE_ARGS="-DGGML_AVX512=ON ..." benchmarks/build_reference.sh DIR   # extra cmake arguments
#
# On a CPU with Intel AMX, GCC 12 (Debian 12's) builds llama.cpp's AMX kernels so that every prompt
# crashes it (the compiler drops the stores that fill the tile configuration before ldtilecfg), and clang 14
# spells the feature macros __AMXINT8__/__AMXTILE__, so llama.cpp compiles its AMX kernels out. The working
# AMX reference (BENCHMARKS.md) is clang with the spelling llama.cpp checks for (cmake takes CFLAGS and
# CXXFLAGS from the environment on a fresh build directory):
#   CC=clang CXX=clang++ CFLAGS='-D__AMX_INT8__=1 -D__AMX_TILE__=1' CXXFLAGS='-D__AMX_INT8__=1 -D__AMX_TILE__=1' \
#     benchmarks/build_reference.sh DIR
#
# Then: LLAMACY_REF_BENCH=DIR/build/bin/llama-bench make bench   (or run_all.py --ref-bench PATH)
#       LLAMACY_REF_SERVER=DIR/build/bin/llama-server make bench-server   (or bench_server.py --ref-server PATH)
set -euo pipefail

COMMIT="${LLAMA_CPP_COMMIT:-3f545becc}"
REPO_URL="${LLAMA_CPP_URL:-https://github.com/ggml-org/llama.cpp}"
DIR="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/llamacy/reference/llama.cpp}"
JOBS="${JOBS:-$(nproc)}"

here="$(cd "$(dirname "$0")/.." && pwd -P)"
case "$(realpath -m "$DIR")/" in
  "$here"/*) echo "build_reference.sh: $DIR is inside the repository; pick a directory outside it" >&2; exit 2 ;;
esac
mkdir -p "$(dirname "$DIR")"

if [ ! -d "$DIR/.git" ]; then
  git clone --filter=blob:none --no-checkout "$REPO_URL" "$DIR"
fi
git -C "$DIR" fetch --quiet origin || true  # a pinned commit already present needs no network
git -C "$DIR" checkout --quiet --detach "$COMMIT"
echo "llama.cpp at $(git -C "$DIR" rev-parse --short=9 HEAD)"

# llama-server's web UI is fetched with npm at build time, which waits forever where no registry answers;
# offline, npm fails at once and the server builds without the UI (the benchmarks need none).
export npm_config_offline=true
cmake -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_HTML=OFF ${LLAMA_CPP_CMAKE_ARGS:-}
cmake --build "$DIR/build" -j "$JOBS" --target llama-bench llama-server llama-completion
echo "built: $DIR/build/bin/{llama-bench,llama-server,llama-completion}"
