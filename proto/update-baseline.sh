#!/bin/sh
# Rewrites proto/baseline.binpb from the .proto files as they are now. The baseline is what the
# breaking-change test compares the frozen packages (common/v1, agent/v1) against: run this only when a
# release freezes the current outline, and commit the result with the release.
set -eu
cd "$(dirname "$0")"
protoc -I . --descriptor_set_out=baseline.binpb $(find bettercompute -name '*.proto' | LC_ALL=C sort)
echo "wrote $(pwd)/baseline.binpb"
