#!/usr/bin/env bash
# Installs everything kite needs to build and test on Debian 12, from Debian's packages only.
# Used by the README's first command and by .ci/run. Safe to run again: it only installs what is
# missing (so a machine that has everything does not even refresh the package lists).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang libclang-rt-14-dev          # libFuzzer targets
  doctest-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  libpcre2-dev                      # tokenizer pre-tokenizer regexes (Unicode properties)
  unicode-data                      # UnicodeData.txt: BERT normalization tables (generated at build)
  openssl                           # the server's HTTPS test makes a throwaway certificate
  chromium                          # the chat page test loads / in headless Chromium
  g++-aarch64-linux-gnu qemu-user   # the NEON kernels' op tests, cross-built and run under qemu
  libvulkan-dev glslc               # the Vulkan backend: headers, the loader, the shader compiler
  mesa-vulkan-drivers               # lavapipe: a Vulkan device on the CPU, for the Vulkan tests
  libboost-context-dev              # fibers for the CPU CUDA emulator (the CUDA backend's tests)
)
# Node.js and npm run the official `openai` client against `kite serve` in the tests. Any Node >= 18
# does (Debian 12's nodejs + npm; a machine that already has node and npm keeps its own).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present" >&2
fi

# npm packages the tests drive, pinned by their package-lock.json (from the npm registry): the
# official openai client, and playwright-core (it drives Debian's chromium; it downloads nothing).
tests="$(dirname "$0")/../tests"
for pkg in openai/node_modules/openai browser/node_modules/playwright-core; do
  dir="$tests/${pkg%%/*}"
  [ -d "$tests/$pkg" ] || (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
done
