#!/usr/bin/env sh
# libkite.so exports the C API and nothing else: every defined dynamic symbol starts with kite_,
# and every KITE_API function of kite.h is there.
set -eu
lib="$1"
header="$2"
symbols=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
others=$(printf '%s\n' "$symbols" | grep -v '^kite_' | grep -v '^$' || true)
if [ -n "$others" ]; then
  echo "libkite.so exports symbols other than kite_*:"; printf '%s\n' "$others" | head -20; exit 1
fi
missing=0
for f in $(grep -v '^#' "$header" | grep -o 'KITE_API [^(]*(' | sed 's/($//; s/.*[ *]//'); do
  printf '%s\n' "$symbols" | grep -qx "$f" || { echo "kite.h declares $f, libkite.so does not export it"; missing=1; }
done
[ "$missing" = 0 ] || exit 1
echo "libkite.so: $(printf '%s\n' "$symbols" | wc -l) symbols, all kite_*, every kite.h function present"
