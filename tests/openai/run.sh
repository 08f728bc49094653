#!/bin/sh
# tests/openai/run.sh KITE_EXE MODEL — the openai-client tests (node --test) against a real
# `kite serve` on loopback. Needs `npm ci` in tests/openai first (scripts/install-deps.sh does it).
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/node_modules/openai" ]; then
  echo "run.sh: $here/node_modules/openai is missing; run 'npm ci' in $here" >&2
  exit 1
fi
exec "$here/../serve-and-run.sh" "$1" "$2" node --test "$here/openai.test.mjs"
