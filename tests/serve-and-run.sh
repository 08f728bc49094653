#!/bin/sh
# tests/serve-and-run.sh KITE_EXE MODEL CMD [ARGS...] — starts `kite serve` on a free loopback port
# with a throwaway API key, runs CMD with KITE_URL and KITE_API_KEY set, then stops the server with
# SIGTERM and checks that it exits 0. The exit status is CMD's (or 1 when the server misbehaved).
set -u
exe=$1
model=$2
shift 2
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
  echo "serve-and-run.sh: kite serve did not become ready:" >&2
  cat "$log" >&2
  kill -9 $pid 2>/dev/null
  rm -f "$log"
  exit 1
fi
KITE_URL="http://127.0.0.1:$port" KITE_API_KEY="$key" "$@"
status=$?
kill -TERM $pid
wait $pid
server_status=$?
if [ $server_status -ne 0 ]; then
  echo "serve-and-run.sh: kite serve exited with $server_status after SIGTERM" >&2
  status=1
fi
if [ $status -ne 0 ]; then
  echo "serve-and-run.sh: server log:" >&2
  cat "$log" >&2
fi
rm -f "$log"
exit $status
