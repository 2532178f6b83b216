#!/bin/sh
# encode-seeds.sh PROTOC PROTO_ROOT OUT_DIR SEED.txtpb...
# Encodes each text-format seed with protoc. A seed's first line names its message type:
#   # proto-message: bettercompute.agent.v1.AgentFrame
set -eu
protoc=$1 proto_root=$2 out=$3
shift 3
mkdir -p "$out"
protos=$(cd "$proto_root" && find bettercompute -name '*.proto' | LC_ALL=C sort)
for seed in "$@"; do
  type=$(sed -n '1s/^# proto-message: //p' "$seed")
  [ -n "$type" ] || { echo "$seed: first line must be '# proto-message: TYPE'" >&2; exit 1; }
  (cd "$proto_root" && "$protoc" -I . --encode="$type" $protos) < "$seed" > "$out/$(basename "$seed" .txtpb).bin"
done
