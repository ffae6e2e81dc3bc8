// A model's commands written and read with avsc from the schema that
// `denorm schema --model M` prints, and nothing else: the JavaScript
// example of docs/model.md, run by tests/it/interop.rs.
//
//   node model_commands.js encode SCHEMA_FILE < JSONL   (prints hex messages, one a line)
//   node model_commands.js decode SCHEMA_FILE < HEX     (prints JSONL lines)
//   node model_commands.js produce SCHEMA_FILE MODEL_FILE BROKERS TOPIC < JSONL
//                                                       (prints a delivery a line)
//
// The model file (TOML, read with smol-toml) gives each kind's ordering
// key. kafkajs producers are not idempotent unless asked (tansu 0.6, the
// test broker, dies on their InitProducerId); against Apache Kafka, pass
// idempotent: true.
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

function message({ namespace, type, fp }, op, kind, tenant, fields, after = null) {
  const datum = type.toBuffer({
    command_id: crypto.randomUUID(),
    issued_at: Date.now(),
    tenant: tenant === undefined ? null : tenant,
    after,
    repair: null,
    // The payload's branch by its full name: the model's namespace, the
    // kind, the operation. Fields left out take their defaults (null, or
    // an empty nested list).
    payload: { [`${namespace}.${kind}.${OPS[op]}`]: fields },
  });
  return Buffer.concat([Buffer.from([0xc3, 0x01]), fp, datum]);
}

function encode(path) {
  const schema = load(path);
  for (const line of lines()) {
    const { op, kind, tenant, ...fields } = JSON.parse(line);
    console.log(message(schema, op, kind, tenant, fields).toString('hex'));
  }
}

const top = (path) => '/' + path.split('/')[1];

// The field a kind is keyed by (null: its own id), and whether it is a
// path, from the model file's `key` (docs/model.md, "The ordering key").
function keyField(model, kind) {
  const key = model.kinds[kind].key;
  if (key === 'id') return [null, false];
  if (key.owner !== undefined) return [key.owner, false];
  return [key.path, true];
}

// The Kafka key of a command: its ordering key, after its tenant and the
// unit separator (0x1f) for a tenant's command.
function keyOf(model, op, kind, tenant, c) {
  const [field, isPath] = keyField(model, kind);
  let key;
  if (op === 'rename_prefix') key = top(c.from);
  else if (field === null) key = c.id;
  else {
    const value = op === 'upsert' ? c.fields[field] : c[field];
    key = isPath ? top(value) : value;
  }
  return tenant ? `${tenant}\x1f${key}` : key;
}

async function produce(path, modelPath, brokers, topic) {
  const { Kafka, Partitioners, logLevel } = require('kafkajs');
  const { parse } = require('smol-toml');
  const schema = load(path);
  const model = parse(fs.readFileSync(modelPath, 'utf8'));
  const kafka = new Kafka({ clientId: 'denorm-interop-js-model', brokers: brokers.split(','), logLevel: logLevel.WARN });
  // The Java client's partitioner (murmur2), as denorm's own producer uses.
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, idempotent: false });
  await producer.connect();
  const send = async (op, kind, tenant, c, after = null) => {
    const key = keyOf(model, op, kind, tenant, c);
    // One at a time: the order of a key's commands is the log order.
    const [md] = await producer.send({ topic, acks: -1, messages: [{ key, value: message(schema, op, kind, tenant, c, after) }] });
    const delivered = { key, partition: md.partition, offset: Number(md.baseOffset) };
    console.log(JSON.stringify(delivered));
    return delivered;
  };
  try {
    for (const line of lines()) {
      const { op, kind, tenant, ...c } = JSON.parse(line);
      const [field] = keyField(model, kind);
      const previous = field !== null && op === 'upsert' ? c[`previous_${field}`] : undefined;
      if (previous === undefined || previous === null) {
        await send(op, kind, tenant, c);
        continue;
      }
      // An owner change: the document's delete under the key it leaves,
      // then its upsert, naming where that delete landed.
      const md = await send('delete', kind, tenant, { id: c.id, [field]: previous });
      await send(op, kind, tenant, c, { partition: md.partition, offset: md.offset });
    }
  } finally {
    await producer.disconnect();
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

const [command, ...args] = process.argv.slice(2);
Promise.resolve(({ encode, decode, produce })[command](...args)).catch((e) => {
  console.error(e);
  process.exit(1);
});
