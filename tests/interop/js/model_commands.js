// A model's commands written and read with avsc from the schema that
// `denorm schema --model M` prints, and nothing else: the JavaScript
// example of docs/model.md, run by tests/it/interop.rs.
//
//   node model_commands.js encode SCHEMA_FILE < JSONL   (prints hex messages, one a line)
//   node model_commands.js decode SCHEMA_FILE < HEX     (prints JSONL lines)
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const avro = require('avsc');
const { crc64avro } = require('./crc64avro');

const OPS = { upsert: 'Upsert', patch: 'Patch', delete: 'Delete', rename_prefix: 'RenamePrefix' };

function load(path) {
  const raw = JSON.parse(fs.readFileSync(path, 'utf8'));
  // avsc's default: a union of null and one type takes the plain value; the
  // payload union of records names its branch, {"<namespace>.<kind>.Upsert": {...}}.
  const type = avro.Type.forSchema(raw);
  // The 8 bytes after C3 01: CRC-64-AVRO of the canonical form, little-endian.
  const fp = Buffer.alloc(8);
  fp.writeBigUInt64LE(crc64avro(Buffer.from(JSON.stringify(type.schema()), 'utf8')));
  return { namespace: raw.namespace, type, fp };
}

function lines() {
  return fs.readFileSync(0, 'utf8').split('\n').filter((l) => l.trim() !== '');
}

function encode(path) {
  const { namespace, type, fp } = load(path);
  for (const line of lines()) {
    const { op, kind, tenant, ...fields } = JSON.parse(line);
    const datum = type.toBuffer({
      command_id: crypto.randomUUID(),
      issued_at: Date.now(),
      tenant: tenant === undefined ? null : tenant,
      after: null,
      repair: null,
      // Fields left out take their defaults (null, or an empty nested list).
      payload: { [`${namespace}.${kind}.${OPS[op]}`]: fields },
    });
    console.log(Buffer.concat([Buffer.from([0xc3, 0x01]), fp, datum]).toString('hex'));
  }
}

function withoutNulls(v) {
  if (Array.isArray(v)) return v.map(withoutNulls);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).filter(([, x]) => x !== null).map(([k, x]) => [k, withoutNulls(x)]));
  return v;
}

function decode(path) {
  const { namespace, type, fp } = load(path);
  const names = Object.fromEntries(Object.entries(OPS).map(([k, v]) => [v, k]));
  for (const line of lines()) {
    const v = Buffer.from(line.trim(), 'hex');
    if (v[0] !== 0xc3 || v[1] !== 0x01 || !v.subarray(2, 10).equals(fp)) throw new Error(`not single-object encoded with this schema: ${v.subarray(0, 10).toString('hex')}`);
    const r = type.fromBuffer(v.subarray(10));
    const [[name, payload]] = Object.entries(r.payload);
    const [kind, op] = name.slice(namespace.length + 1).split('.');
    const out = { op: names[op], kind };
    if (r.tenant !== null) out.tenant = r.tenant;
    console.log(JSON.stringify({ ...out, ...withoutNulls(payload) }));
  }
}

({ encode, decode })[process.argv[2]](process.argv[3]);
