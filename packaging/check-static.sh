#!/bin/sh
# Checks the static build of bcd (for ramdisks, -DBCD_STATIC=ON): no interpreter and no shared
# library, it runs, and on the dev stack it joins, holds a session and runs a command.
#   check-static.sh BCD BCD_DEV
set -eu
bcd=$1
dev=$2
tmp=$(mktemp -d)
up=''
cleanup() {
  if [ -n "$up" ]; then kill "$up" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "check-static: $*" >&2
  exit 1
}

if readelf --program-headers "$bcd" | grep -q INTERP; then fail "$bcd has a program interpreter"; fi
if readelf --dynamic "$bcd" | grep -q NEEDED; then fail "$bcd needs shared libraries"; fi
"$bcd" version | grep -q '^bcd ' || fail "$bcd version does not run"
strip -o "$tmp/bcd" "$bcd"
echo "static bcd: $(du -k "$tmp/bcd" | cut -f1) KiB stripped"

"$dev" up --dir "$tmp/stack" --seconds 120 --bcd "$tmp/bcd" >"$tmp/up.log" 2>&1 &
up=$!
i=0
until [ -S "$tmp/stack/dev.sock" ] && "$dev" run inventory.refresh --dir "$tmp/stack" >"$tmp/run.log" 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 200 ] || fail "no inventory.refresh through the static bcd: $(cat "$tmp/run.log" "$tmp/up.log")"
  sleep 0.1
done
grep -q '"state": "COMMAND_STATE_SUCCEEDED"' "$tmp/run.log" || fail "inventory.refresh: $(cat "$tmp/run.log")"
echo "static bcd joined the dev stack and ran inventory.refresh"
