// Checks what bcd made, with jose and Node's crypto:
//   node check-ours.mjs NODE_FIXTURES.json OURS.json
// OURS.json (from pki_interop_produce) holds bcd's ES256 signatures over signing inputs, a JWE
// sealed to the fixtures' recipient key, and a JWT with its JWKS. Exits non-zero on any mismatch.
import { compactDecrypt, createLocalJWKSet, importPKCS8, jwtVerify, base64url } from 'jose';
import crypto from 'node:crypto';
import fs from 'node:fs';
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

console.log(`jose and Node's crypto accepted ${checked} of bcd's artifacts`);
