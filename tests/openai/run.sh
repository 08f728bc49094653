#!/bin/sh
# tests/openai/run.sh KITE_EXE MODEL — starts `kite serve` on a free loopback port, runs the
# openai-client tests (node --test) against it, stops it with SIGTERM and checks it exits 0.
# Needs `npm ci` in tests/openai first (scripts/install-deps.sh / .ci/run do it).
set -u
exe=$1
model=$2
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/node_modules/openai" ]; then
  echo "run.sh: $here/node_modules/openai is missing; run 'npm ci' in $here" >&2
  exit 1
fi
log=$(mktemp)
key="kite-test-key-$$"
"$exe" serve -m "$model" --port 0 -c 1024 --parallel 4 --api-key "$key" 2>"$log" &
pid=$!
port=
i=0
while [ $i -lt 300 ]; do
  if grep -q "ready (" "$log"; then
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n 1)
    break
  fi
  if ! kill -0 $pid 2>/dev/null; then break; fi
  sleep 0.1
  i=$((i + 1))
done
if [ -z "$port" ]; then
  echo "run.sh: kite serve did not become ready:" >&2
  cat "$log" >&2
  kill -9 $pid 2>/dev/null
  rm -f "$log"
  exit 1
fi
KITE_URL="http://127.0.0.1:$port" KITE_API_KEY="$key" node --test "$here/openai.test.mjs"
status=$?
kill -TERM $pid
wait $pid
server_status=$?
if [ $server_status -ne 0 ]; then
  echo "run.sh: kite serve exited with $server_status after SIGTERM" >&2
  cat "$log" >&2
  status=1
fi
rm -f "$log"
exit $status
