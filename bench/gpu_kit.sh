#!/bin/sh
# gpu_kit.sh [DIR] — packs what a run on the GPU machine needs beside the working tree into DIR (default
# .dev-gpu, ignored by git), for the device tool's `carry` (64 MiB a call, the tree included):
#   DIR/kit.tar.xz   the Debian libraries kiln builds against (PCRE2, Jansson, libmicrohttpd and what it needs;
#                    that machine has no package manager), the tokenizers `kiln mkmodel` needs for the bench
#                    shapes (SmolLM2, Llama 3) and the test data of the CUDA tests that fits (stories260K and
#                    TinyStories-656K with their expected outputs)
#                    and, with GPU_KIT_ARCHS="tiny-qwen2 tiny-qwen3 ..." (names in ../shared/models/archs), those
#                    models and their expected outputs (each ~12 MB compressed: with the reference binary, none fit)
#   DIR/llama.xz     the reference engine's CUDA binary (../shared/ref/cuda), unless GPU_KIT_NO_REF=1
#   DIR/env.sh       to source first on that machine, from the repository root: unpacks the kit into /tmp/kit
#                    and sets C_INCLUDE_PATH / LIBRARY_PATH / LD_LIBRARY_PATH, KILN_SHARED=/tmp/kit/shared and
#                    KILN_LLAMA (the reference, unpacked into /tmp/llama)
# Run here (it downloads the .deb files with apt-get download). Then, e.g.:
#   device run, carry [".dev-gpu"]:  . .dev-gpu/env.sh && bash bench/cuda_patch_ab.sh PATCH
#   GPU_KIT_NO_REF=1 GPU_KIT_ARCHS="tiny-qwen2 tiny-qwen3moe tiny-llama-rope-freqs" sh bench/gpu_kit.sh .dev-gput, then
#   device run, carry [".dev-gput"]: . .dev-gput/env.sh && bash bench/gpu_suite.sh kernels/pipe-b-lag
set -eu
DIR=${1:-.dev-gpu}
SHARED=${KILN_SHARED:-../shared}
mkdir -p "$DIR"
DIR=$(realpath "$DIR")
SHARED=$(realpath "$SHARED")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/debs" "$T/kit/sys" "$T/kit/tok/llama3" "$T/kit/tok/smollm2" "$T/kit/shared/models"
(cd "$T/debs" && apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libmicrohttpd-dev \
    libmicrohttpd12 libgnutls30 libnettle8 libhogweed6 libp11-kit0 libtasn1-6 libidn2-0 libunistring2 libgmp10 \
    libffi8 > /dev/null 2>&1) || { echo "gpu_kit.sh: apt-get download failed"; exit 1; }
for f in "$T"/debs/*.deb; do dpkg -x "$f" "$T/kit/sys"; done
rm -rf "$T/kit/sys/usr/share"
find "$T/kit/sys" \( -name '*.a' -o -name 'libpcre2-16*' -o -name 'libpcre2-32*' -o -name 'libpcre2-posix*' \) -delete
cp "$SHARED/models/tokenizers/llama3/tokenizer.json" "$SHARED/models/tokenizers/llama3/tokenizer_config.json" \
    "$T/kit/tok/llama3/"
cp "$SHARED/models/tokenizers/smollm2-135m-instruct/"* "$T/kit/tok/smollm2/"
mkdir -p "$T/kit/shared/models/tokenizers"
ln -s ../../../tok/llama3 "$T/kit/shared/models/tokenizers/llama3"
ln -s ../../../tok/smollm2 "$T/kit/shared/models/tokenizers/smollm2-135m-instruct"
cp -r "$SHARED/models/stories260K" "$T/kit/shared/models/"
mkdir -p "$T/kit/shared/models/tinystories-656K"
cp -r "$SHARED/models/tinystories-656K/TinyStories-656K-Q8_0.gguf" "$SHARED/models/tinystories-656K/expected" \
    "$SHARED/models/tinystories-656K/quants" "$T/kit/shared/models/tinystories-656K/"
for a in ${GPU_KIT_ARCHS:-}; do
    mkdir -p "$T/kit/shared/models/archs/expected/llama.cpp"
    cp "$SHARED/models/archs/$a.gguf" "$T/kit/shared/models/archs/" || exit 1
    cp "$SHARED/models/archs/expected/llama.cpp/$a."* "$T/kit/shared/models/archs/expected/llama.cpp/"
done
chmod -R u+w "$T/kit"
tar cJf "$DIR/kit.tar.xz" -C "$T/kit" .
if [ "${GPU_KIT_NO_REF:-0}" = 1 ]; then rm -f "$DIR/llama.xz"; else cp "$SHARED/ref/cuda/llama.xz" "$DIR/"; fi
cat > "$DIR/env.sh" <<EOF
# sourced on the GPU machine from the repository root (bench/gpu_kit.sh)
[ -d /tmp/kit/sys ] || { mkdir -p /tmp/kit && tar xJf $(basename "$DIR")/kit.tar.xz -C /tmp/kit; }
export C_INCLUDE_PATH=/tmp/kit/sys/usr/include:/tmp/kit/sys/usr/include/x86_64-linux-gnu
export LIBRARY_PATH=/tmp/kit/sys/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=/tmp/kit/sys/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:\$PATH KILN_SHARED=/tmp/kit/shared
if [ -f $(basename "$DIR")/llama.xz ]; then
    [ -x /tmp/llama ] || { xz -dc $(basename "$DIR")/llama.xz > /tmp/llama && chmod +x /tmp/llama; }
    export KILN_LLAMA=/tmp/llama
fi
EOF
du -sh "$DIR"/*
echo "gpu_kit.sh: carry [\"$(basename "$DIR")\"]; on the machine: . $(basename "$DIR")/env.sh"
