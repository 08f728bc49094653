#!/usr/bin/env bash
# The README's first command: install dependencies, build, run kite on the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=models/llama-draft-Q8_0.gguf
echo "== kite run -m $model -p 'The old prince' -n 96" >&2
build/tools/kite run -m "$model" -p "The old prince" -n 96 --temp 0.7 --seed 42
