#!/bin/sh
# tests/browser/run.sh KITE_EXE MODEL — loads the chat page of a real `kite serve` in headless
# Chromium (Debian's `chromium`, driven by playwright-core). Needs `npm ci` in tests/browser and the
# chromium package (scripts/install-deps.sh installs both).
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/node_modules/playwright-core" ]; then
  echo "run.sh: $here/node_modules/playwright-core is missing; run 'npm ci' in $here" >&2
  exit 1
fi
export KITE_CHROMIUM="${KITE_CHROMIUM:-$(command -v chromium || echo /usr/bin/chromium)}"
exec "$here/../serve-and-run.sh" "$1" "$2" node --test "$here/chat-page.test.mjs"
