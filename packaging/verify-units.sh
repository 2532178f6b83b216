#!/bin/sh
# Checks the units with systemd-analyze verify, their ExecStart pointed at BCD (the built binary)
# and their Documentation= man page found at MANPAGE (the built bcd.8), and fails on any
# complaint, warnings included.
#   verify-units.sh BCD MANPAGE
set -eu
bcd=$1
dir=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/man/man8"
cp "$2" "$tmp/man/man8/bcd.8"
MANPATH=$tmp/man
export MANPATH
for unit in bcd-node.service bcd-site.service ramdisk/bcd-ramdisk.service; do
  name=$(basename "$unit")
  sed "s|/usr/bin/bcd|$bcd|" "$dir/$unit" > "$tmp/$name"
  out=$(systemd-analyze verify "$tmp/$name" 2>&1) || { echo "$unit: $out" >&2; exit 1; }
  if [ -n "$out" ]; then
    echo "$unit: $out" >&2
    exit 1
  fi
  echo "$unit: ok"
done
