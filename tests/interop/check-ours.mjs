// Checks what bcd made, with jose and Node's crypto:
//   node check-ours.mjs NODE_FIXTURES.json OURS.json
// OURS.json (from pki_interop_produce) holds bcd's ES256 signatures over signing inputs, a JWE
// sealed to the fixtures' recipient key, and a JWT with its JWKS. Exits non-zero on any mismatch.
import { compactDecrypt, createLocalJWKSet, importPKCS8, jwtVerify, base64url } from 'jose';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { signingInput, u64 } from './layout.mjs';
import assert from 'node:assert/strict';

const fixtures = JSON.parse(fs.readFileSync(process.argv[2]));
const ours = JSON.parse(fs.readFileSync(process.argv[3]));
let checked = 0;

const key = crypto.createPublicKey({ key: Buffer.from(ours.spki, 'hex'), format: 'der', type: 'spki' });
for (const s of ours.signatures) {
  const ok = crypto.verify('sha256', Buffer.from(s.input, 'hex'), { key, dsaEncoding: 'ieee-p1363' }, Buffer.from(s.sig, 'hex'));
  assert.ok(ok, `bcd's ${s.purpose} signature does not verify in Node`);
  checked++;
}

const recipient = await importPKCS8(fixtures.recipient_pkcs8, 'ECDH-ES+A256KW');
const { plaintext, protectedHeader } = await compactDecrypt(ours.jwe, recipient);
assert.equal(new TextDecoder().decode(plaintext), ours.jwe_plaintext);
assert.equal(protectedHeader.alg, 'ECDH-ES+A256KW');
assert.equal(protectedHeader.enc, 'A256GCM');
assert.equal(protectedHeader.typ, 'bcsecret+jwe');
assert.equal(protectedHeader.ref, 'secret://db/password');
assert.equal(protectedHeader.rid, 'r-1');
checked++;

const { payload, protectedHeader: jwsHeader } = await jwtVerify(ours.jwt, createLocalJWKSet(JSON.parse(ours.jwks)), {
  audience: 'node:n-1', currentDate: new Date(ours.now * 1000),
});
assert.equal(jwsHeader.alg, 'ES256');
assert.equal(payload.op, 'exec');
assert.deepEqual(payload.cmd, ['id']);
checked++;

// The WebSocket upgrade, read with Node's crypto and the layout of layout.mjs.
const b64u = (text) => Buffer.from(base64url.decode(text));
// Parts: uint32_be(len) || bytes, repeated.
function splitParts(bytes) {
  const parts = [];
  for (let at = 0; at < bytes.length;) {
    const len = bytes.readUInt32BE(at);
    parts.push(bytes.subarray(at + 4, at + 4 + len));
    at += 4 + len;
  }
  return parts;
}
// Just enough of the protobuf wire format for SignedEnvelope, Signature and GatewayProof.
function fields(bytes) {
  const out = [];
  let at = 0;
  const varint = () => {
    let value = 0n, shift = 0n;
    for (;;) {
      const b = bytes[at++];
      value |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return value;
      shift += 7n;
    }
  };
  while (at < bytes.length) {
    const key = Number(varint());
    const number = key >> 3, type = key & 7;
    if (type === 0) out.push([number, varint()]);
    else if (type === 2) {
      const len = Number(varint());
      out.push([number, bytes.subarray(at, at + len)]);
      at += len;
    } else throw new Error(`unexpected wire type ${type}`);
  }
  return out;
}
const field = (list, n) => list.filter(([k]) => k === n).map(([, v]) => v);

const ws = ours.ws;
const chain = splitParts(b64u(ws.headers['x-bc-node-chain'])).map((der) => new crypto.X509Certificate(der));
assert.equal(chain.length, 2);
assert.equal(chain[0].raw.toString('hex'), ws.leaf);
assert.equal(chain[1].raw.toString('hex'), ws.node_ca);
assert.ok(chain[0].verify(chain[1].publicKey), 'the node chain does not verify in Node');
assert.ok(chain[0].toLegacyObject().subjectaltname.includes('spiffe://dev.test/site/dev/node/n-1'));
const nonce = b64u(ws.headers['x-bc-nonce']);
assert.equal(nonce.length, 16);
const wsInput = signingInput('ws-session', [nonce, u64(ws.headers['x-bc-time']), chain[0].raw, Buffer.from(ws.host)]);
assert.ok(crypto.verify('sha256', wsInput, { key: chain[0].publicKey, dsaEncoding: 'ieee-p1363' },
  b64u(ws.headers['x-bc-node-proof'])), 'x-bc-node-proof does not verify in Node');
checked++;

const envelope = fields(b64u(ws.gateway_proof));
const body = field(envelope, 1)[0];
const signature = fields(field(envelope, 2)[0]);
const proofChain = field(signature, 3).map((der) => new crypto.X509Certificate(der));
assert.equal(proofChain[0].raw.toString('hex'), ws.serving_leaf);
assert.equal(proofChain[1].raw.toString('hex'), ws.serving_ca);
assert.ok(proofChain[0].verify(proofChain[1].publicKey), 'the serving chain does not verify in Node');
assert.ok(crypto.verify('sha256', signingInput('gateway-proof', [body]),
  { key: proofChain[0].publicKey, dsaEncoding: 'ieee-p1363' }, field(signature, 1)[0]),
  'x-bc-gateway-proof does not verify in Node');
const proof = fields(body);
assert.equal(Buffer.from(field(proof, 1)[0]).toString(), 'n-1');
assert.ok(Buffer.from(field(proof, 2)[0]).equals(nonce), 'the proof does not echo the nonce');
assert.equal(Number(field(proof, 3)[0]), ours.now);
checked++;

console.log(`jose and Node's crypto accepted ${checked} of bcd's artifacts`);
