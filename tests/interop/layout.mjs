// The agent/v1 signing-input layout, written here from the protocol page and independently of
// bcd's code: "bettercompute.v1/<purpose>\0", then each part as uint32_be(length) || bytes.
export function signingInput(purpose, parts) {
  const chunks = [Buffer.from(`bettercompute.v1/${purpose}\0`)];
  for (const p of parts) {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(p.length);
    chunks.push(len, p);
  }
  return Buffer.concat(chunks);
}

export const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(v)); return b; };
