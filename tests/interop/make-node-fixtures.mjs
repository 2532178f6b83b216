// Makes JWE, JWT and ES256 fixtures with jose and Node's crypto, for bcd's tests to open and verify:
//   node make-node-fixtures.mjs OUT.json
// Every fixture is made at a fixed clock (NOW) so the tests can inject the same time.
import { CompactEncrypt, SignJWT, UnsecuredJWT, exportJWK, exportPKCS8, generateKeyPair, base64url } from 'jose';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { signingInput, u64 } from './layout.mjs';

const NOW = 1800000000;
const out = {};
const hex = (b) => Buffer.from(b).toString('hex');

// --- JWE (ECDH-ES+A256KW, A256GCM) to a recipient key the test holds.
const recipient = await generateKeyPair('ECDH-ES+A256KW', { crv: 'P-256', extractable: true });
out.recipient_pkcs8 = await exportPKCS8(recipient.privateKey);
out.recipient_jwk = await exportJWK(recipient.privateKey);
const enc = new TextEncoder();
async function jwe(header, plaintext = 'hunter2') {
  return new CompactEncrypt(enc.encode(plaintext)).setProtectedHeader(header).encrypt(recipient.publicKey);
}
const secret = { alg: 'ECDH-ES+A256KW', enc: 'A256GCM', typ: 'bcsecret+jwe', ref: 'secret://db/password', rid: 'r-1', exp: NOW + 600 };
out.jwe = {
  valid: await jwe(secret),
  workload: await jwe({ alg: 'ECDH-ES+A256KW', enc: 'A256GCM', typ: 'bcworkload+jwe', iid: 'i-7', rid: 'r-2', exp: NOW + 600 }, 'eyJ.token.sig'),
  other_alg: await jwe({ ...secret, alg: 'ECDH-ES+A128KW' }),
  other_enc: await jwe({ ...secret, enc: 'A128GCM' }),
  other_typ: await jwe({ ...secret, typ: 'JWT' }),
  other_ref: await jwe({ ...secret, ref: 'secret://db/other' }),
  other_rid: await jwe({ ...secret, rid: 'r-9' }),
  expired: await jwe({ ...secret, exp: NOW - 1 }),
};
{
  const parts = out.jwe.valid.split('.');
  const tag = Buffer.from(base64url.decode(parts[4]));
  tag[0] ^= 1;
  out.jwe.tampered_tag = [...parts.slice(0, 4), base64url.encode(tag)].join('.');
  const header = JSON.parse(Buffer.from(base64url.decode(parts[0])).toString());
  const y = Buffer.from(base64url.decode(header.epk.y));
  y[31] ^= 1;  // (x, y') is not on the curve
  header.epk.y = base64url.encode(y);
  out.jwe.epk_off_curve = [base64url.encode(JSON.stringify(header)), ...parts.slice(1)].join('.');
}

// --- JWT tunnel tickets (ES256) against a JWKS.
const ticketKey = await generateKeyPair('ES256', { extractable: true });
const jwk = { ...(await exportJWK(ticketKey.publicKey)), kid: 't1', alg: 'ES256', use: 'sig' };
out.jwks = JSON.stringify({ keys: [jwk] });
const claims = { aud: 'node:n-1', jti: 'j-1', iat: NOW, exp: NOW + 60, sid: 'sess-1', tid: 'tun-1', op: 'shell', rows: 40, cols: 120 };
async function jwt(c, kid = 't1') {
  return new SignJWT(c).setProtectedHeader({ alg: 'ES256', kid, typ: 'JWT' }).sign(ticketKey.privateKey);
}
out.jwt = {
  valid: await jwt(claims),
  exec: await jwt({ ...claims, jti: 'j-2', op: 'exec', cmd: ['uname', '-a'], rows: undefined, cols: undefined }),
  tcp: await jwt({ ...claims, jti: 'j-3', op: 'tcp', host: '127.0.0.1', port: 5432 }),
  wrong_aud: await jwt({ ...claims, aud: 'node:n-2' }),
  expired: await jwt({ ...claims, iat: NOW - 120, exp: NOW - 60 }),
  too_long: await jwt({ ...claims, exp: NOW + 61 }),
  unknown_kid: await jwt(claims, 't9'),
  wrong_sid: await jwt({ ...claims, sid: 'sess-2' }),
  alg_none: new UnsecuredJWT(claims).encode(),
  hs256: await new SignJWT(claims).setProtectedHeader({ alg: 'HS256', kid: 't1' }).sign(crypto.randomBytes(32)),
};

// --- ES256 over signing inputs, laid out here independently of bcd's code.
const N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551n;
const signer = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
function es256(input, high, key = signer.privateKey) {
  const sig = crypto.sign('sha256', input, { key, dsaEncoding: 'ieee-p1363' });
  let s = BigInt('0x' + sig.subarray(32).toString('hex'));
  const low = s > N / 2n ? N - s : s;
  s = high ? N - low : low;
  return Buffer.concat([sig.subarray(0, 32), Buffer.from(s.toString(16).padStart(64, '0'), 'hex')]);
}
out.signer_spki = hex(signer.publicKey.export({ type: 'spki', format: 'der' }));
const cases = [
  ['command', [Buffer.from('command body bytes')]],
  ['renew', [Buffer.from('csr'), u64(NOW), Buffer.from('0123456789abcdef'), Buffer.from('leaf')]],
  ['approver-set', [u64(7), crypto.createHash('sha256').update('set').digest(), Buffer.from('example.net')]],
  ['secret-request', ['secret://a', 'wf', 'st', '', 'EPK', 'r-1'].map((s) => Buffer.from(s))],
  ['release', [Buffer.from('1.4.2'), Buffer.from('linux/amd64'), crypto.createHash('sha256').update('bin').digest()]],
];
out.signatures = cases.map(([purpose, parts]) => {
  const input = signingInput(purpose, parts);
  return { purpose, parts: parts.map(hex), input: hex(input), sig: hex(es256(input, false)), high_s_sig: hex(es256(input, true)) };
});

// --- A release (daemon.upgrade) signed by a release key of its own for linux/amd64.
const releaseKey = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const binarySha256 = crypto.createHash('sha256').update('a release binary').digest();
out.release = {
  version: '1.4.2',
  os_arch: 'linux/amd64',
  sha256: hex(binarySha256),
  spki: hex(releaseKey.publicKey.export({ type: 'spki', format: 'der' })),
  spki_pem: releaseKey.publicKey.export({ type: 'spki', format: 'pem' }),
  sig: hex(es256(signingInput('release', [Buffer.from('1.4.2'), Buffer.from('linux/amd64'), binarySha256]),
    false, releaseKey.privateKey)),
};

fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 1) + '\n');
