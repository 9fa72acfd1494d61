#!/bin/sh
# Installs the Debian packages kiln builds against, when they are missing (needs root and apt).
# Build: gcc, make, pkg-config, libpcre2-dev (BPE pre-tokenizer), libjansson-dev (JSON).
# Tests: python3-jinja2 (chat-template reference), clang + libclang-rt (libFuzzer), when available.
set -e
need=""
[ -f /usr/include/pcre2.h ] || need="$need libpcre2-dev"
[ -f /usr/include/jansson.h ] || need="$need libjansson-dev"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v cc >/dev/null 2>&1 || need="$need gcc"
[ -z "$need" ] && exit 0
echo "kiln: installing build dependencies:$need"
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq $need >/dev/null
