#!/bin/sh
# Regenerates every independent fixture and checks both directions:
#   run-pki-interop.sh SOURCE_DIR BUILD_DIR
# 1. jose and Node's crypto make fresh JWEs, JWTs and signatures, the openssl command fresh
#    certificates and a CSR; bcd's fixture tests run against them.
# 2. bcd makes signatures, a JWE, a JWT and a CSR; jose, Node's crypto and `openssl req -verify`
#    check them.
set -eu
src=$1 bin=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$src/tests/interop"
for program in node openssl; do
  if ! command -v "$program" >/dev/null; then
    echo "$program is not installed: the interop test needs it (scripts/test installs it)" >&2
    exit 1
  fi
done
if [ ! -d node_modules/jose ]; then
  echo "jose is not installed: run 'npm ci' in tests/interop (scripts/test does)" >&2
  exit 1
fi
node make-node-fixtures.mjs "$tmp/node.json"
sh "$src/tests/fixtures/pki/make-certs.sh" "$tmp/certs"
BCD_PKI_NODE_FIXTURES="$tmp/node.json" BCD_PKI_CERTS="$tmp/certs" "$bin/tests/bcd_tests" --gtest_brief=1 \
  --gtest_filter='NodeFixtures.*:OpensslFixtures.*:Jwe.*:Ticket.*:Keys.*:Csr.*:WorkerChain.*'
"$bin/tests/interop/pki_interop_produce" "$tmp/node.json" "$tmp/ours.json" "$tmp/ours.csr.der"
node check-ours.mjs "$tmp/node.json" "$tmp/ours.json"
openssl req -in "$tmp/ours.csr.der" -inform DER -verify -noout
