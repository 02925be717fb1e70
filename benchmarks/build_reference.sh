#!/usr/bin/env bash
# Build the native reference engine (llama.cpp) for side-by-side benchmarks: llama-bench, llama-server and
# llama-completion, from a copy fetched OUTSIDE this repository at a pinned commit, tuned for this CPU
# (-DGGML_NATIVE=ON, Release). Never run by CI or `make test`; its code never enters the repository.
#
#   benchmarks/build_reference.sh [DIR]        # default DIR: ~/.cache/llamacy/reference/llama.cpp
#   LLAMA_CPP_COMMIT=<sha> benchmarks/build_reference.sh
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

cmake -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$DIR/build" -j "$JOBS" --target llama-bench llama-server llama-completion
echo "built: $DIR/build/bin/{llama-bench,llama-server,llama-completion}"
