#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench, llama-quantize and llama-perplexity into PREFIX/bin, from the llama.cpp tree vendored in the
# llama-cpp-python sdist (PyPI is the one place this machine fetches source from).
#
#   scripts/build_llamacpp.sh PREFIX        # ~10 minutes on 2 cores; prints the binaries' folder
#
# Idempotent: PREFIX/BUILD records the version and the flags; when it matches, nothing is built.
# GGML_NATIVE=OFF with the instruction sets named one by one: a native build on a CPU that reports AMX used the
# AMX path and crashed on the Q4_1/Q8_0 model here, so AMX stays off while AVX2 and the AVX-512 extensions this
# CPU has are on. LLAMACPP_AMX=ON builds ggml's AMX kernels too, into another PREFIX, for a comparison on a Xeon:
# on an Emerald Rapids its decode was no faster (llama-bench tg32 10.6-11.1 tok/s against 11.5-11.7 on a random
# 1.5B Q4_K_M) and its prompt processing stopped on SIGILL (README, CPU kinds). No web UI (it would be fetched at
# build time), no HTTPS, static libraries (the binaries can move).
set -euo pipefail

VERSION=0.3.36  # llama-cpp-python; its CHANGELOG pins the vendored tree to ggml-org/llama.cpp@0c1e57098
COMMIT=0c1e57098
PREFIX=${1:?usage: scripts/build_llamacpp.sh PREFIX}
JOBS=${JOBS:-2}
TOOLS=(llama-server llama-bench llama-quantize llama-perplexity)  # llama-perplexity: bench.quality's llama.cpp reference

has() { grep -qw "$1" /proc/cpuinfo; }
FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
       -DGGML_AMX_TILE=${LLAMACPP_AMX:-OFF} -DGGML_AMX_INT8=${LLAMACPP_AMX:-OFF} -DGGML_AMX_BF16=${LLAMACPP_AMX:-OFF})
for pair in avx512f:GGML_AVX512 avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI \
            avx512_bf16:GGML_AVX512_BF16 avx_vnni:GGML_AVX_VNNI; do
  if has "${pair%%:*}"; then FLAGS+=("-D${pair#*:}=ON"); else FLAGS+=("-D${pair#*:}=OFF"); fi
done
has avx2 || { echo "build_llamacpp: this CPU has no AVX2, the floor these flags assume" >&2; exit 1; }
STAMP="llama-cpp-python==$VERSION llama.cpp@$COMMIT ${FLAGS[*]}"

built() { for tool in "${TOOLS[@]}"; do [[ -x $PREFIX/bin/$tool ]] || return 1; done; }
if built && [[ -f $PREFIX/BUILD ]] && [[ $(cat "$PREFIX/BUILD") == "$STAMP" ]]; then
  echo "llama.cpp $COMMIT (llama-cpp-python $VERSION) already built: $PREFIX/bin"
  exit 0
fi

for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || { echo "build_llamacpp: $tool is not installed" >&2; exit 1; }
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "build_llamacpp: fetching the llama-cpp-python $VERSION sdist" >&2
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
rm -f "$SRC/.git"  # a submodule pointer to a folder the sdist does not have

echo "build_llamacpp: building ${TOOLS[*]} with -j$JOBS (several minutes)" >&2
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF "${FLAGS[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$COMMIT" >"$WORK/configure.log" \
  || { cat "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --target "${TOOLS[@]}" -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -50 "$WORK/build.log" >&2; exit 1; }

mkdir -p "$PREFIX/bin"
rm -f "$PREFIX/BUILD"
for tool in "${TOOLS[@]}"; do install -m 755 "$WORK/build/bin/$tool" "$PREFIX/bin/"; done
echo "$STAMP" >"$PREFIX/BUILD"
echo "llama.cpp $COMMIT (llama-cpp-python $VERSION) built: $PREFIX/bin"
