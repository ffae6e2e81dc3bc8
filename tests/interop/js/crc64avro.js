// CRC-64-AVRO, as the Avro specification defines it: the fingerprint of a
// schema's Parsing Canonical Form, as written after C3 01.
'use strict';

const EMPTY = 0xc15d213aa4d7a795n;
const TABLE = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n));
  return fp & 0xffffffffffffffffn;
});
function crc64avro(buf) {
  let fp = EMPTY;
  for (const b of buf) fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)];
  return fp;
}

module.exports = { crc64avro };
