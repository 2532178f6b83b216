// A TLS-inspecting HTTP CONNECT proxy, as some sites run: it answers CONNECT, terminates the
// client's TLS with a certificate of its own CA (so client certificates never reach the server),
// and opens its own TLS connection to the server, verified against the server's CA. Bytes are
// relayed in both directions once both handshakes are done. Node's http and tls, nothing of bcd.
//
// node inspecting_proxy.mjs KEY_PEM CERT_PEM UPSTREAM_CA_PEM UPSTREAM_NAME PORT_FILE
// Prints "inspected HOST:PORT" for each tunnel it inspects.

import fs from 'node:fs';
import http from 'node:http';
import tls from 'node:tls';

const [keyFile, certFile, upstreamCaFile, upstreamName, portFile] = process.argv.slice(2);
const key = fs.readFileSync(keyFile);
const cert = fs.readFileSync(certFile);
const ca = fs.readFileSync(upstreamCaFile);

const server = http.createServer((req, res) => {
  res.writeHead(405);
  res.end();
});

server.on('connect', (req, client, head) => {
  const colon = req.url.lastIndexOf(':');
  const host = req.url.slice(0, colon).replace(/^\[|\]$/g, '');
  const port = Number(req.url.slice(colon + 1));
  client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
  const inner = new tls.TLSSocket(client, { isServer: true, key, cert, minVersion: 'TLSv1.3' });
  const upstream = tls.connect({ host, port, ca, servername: upstreamName, minVersion: 'TLSv1.3' });
  if (head && head.length) inner.unshift(head);
  const end = () => {
    inner.destroy();
    upstream.destroy();
  };
  inner.on('error', end);
  upstream.on('error', end);
  inner.on('close', end);
  upstream.on('close', end);
  upstream.on('secureConnect', () => {
    console.log(`inspected ${host}:${port}`);
    inner.pipe(upstream);
    upstream.pipe(inner);
  });
});

server.listen(0, '127.0.0.1', () => {
  fs.writeFileSync(portFile + '.tmp', String(server.address().port));
  fs.renameSync(portFile + '.tmp', portFile);
});
