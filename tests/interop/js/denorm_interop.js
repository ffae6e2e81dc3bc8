// A denorm producer written from schemas/ alone, with avsc and kafkajs: the
// JavaScript example of docs/producers.md, run by tests/it/interop.rs.
//
//   node denorm_interop.js fingerprints SCHEMA_FILE...
//   node denorm_interop.js produce BROKERS TOPIC SCHEMAS_DIR PREFIX
//
// kafkajs producers are not idempotent unless asked (tansu 0.6, the test
// broker, dies on the InitProducerId request of older clients); against
// Apache Kafka, pass idempotent: true.
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const avro = require('avsc');
const { Kafka, Partitioners, logLevel } = require('kafkajs');

const { crc64avro } = require('./crc64avro');

function load(path) {
  // wrapUnions: a union value names its branch, {"denorm.UpsertFile": {...}}.
  return avro.Type.forSchema(JSON.parse(fs.readFileSync(path, 'utf8')), { wrapUnions: true });
}

// The 8 bytes after C3 01: the fingerprint of avsc's Parsing Canonical
// Form, little-endian.
function wireFingerprint(type) {
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(crc64avro(Buffer.from(JSON.stringify(type.schema()), 'utf8')));
  return out;
}

// The ordering key: top-level directory for files, user id for users and posts.
function keyOf(op, f) {
  if (op === 'UpsertFile' || op === 'DeleteFile') return '/' + f.path.split('/')[1];
  if (op === 'RenamePath') return '/' + f.from.split('/')[1];
  if (op === 'UpsertUser' || op === 'DeleteUser') return f.id;
  return f.user_id;
}

function encode(type, fp, op, fields, after) {
  const datum = type.toBuffer({
    command_id: crypto.randomUUID(),
    issued_at: Date.now(),
    tenant: null,
    after: after ? { 'denorm.LogPosition': after } : null,
    payload: { ['denorm.' + op]: fields },
  });
  return Buffer.concat([Buffer.from([0xc3, 0x01]), fp, datum]);
}

function commands(p) {
  const d = '/' + p, u = p + '-u1', u2 = p + '-u2', u3 = p + '-u3';
  return [
    ['UpsertFile', { id: p + '-f1', path: d + '/docs/a.txt', contents: 'alpha from ' + p }],
    ['UpsertFile', { id: p + '-f2', path: d + '/docs/sub/b.txt', contents: 'beta' }],
    ['RenamePath', { from: d + '/docs', to: d + '/papers' }],
    ['DeleteFile', { id: p + '-f2', path: d + '/papers/sub/b.txt' }],
    ['UpsertUser', { id: u, name: 'Ada Before', email: 'ada@example.com', dob: '1815-12-10' }],
    ['UpsertPost', { id: p + '-p1', user_id: u, title: 'Notes', body: 'on the engine' }],
    ['UpsertPost', { id: p + '-p2', user_id: u, title: 'Draft', body: 'to delete' }],
    ['DeletePost', { id: p + '-p2', user_id: u }],
    ['UpsertUser', { id: u, name: 'Ada ' + p + ' After', email: 'ada@example.com', dob: '1815-12-10' }],
    // An owner change: p1 goes to another user, in its two halves.
    ['UpsertUser', { id: u2, name: 'Grace ' + p, email: 'grace@example.com', dob: '1906-12-09' }],
    ['DeletePost', { id: p + '-p1', user_id: u }],
    ['UpsertPost', { id: p + '-p1', user_id: u2, title: 'Notes', body: 'on the engine', previous_user_id: { string: u } }],
    // And f1 to another top-level directory.
    ['DeleteFile', { id: p + '-f1', path: d + '/papers/a.txt' }],
    ['UpsertFile', { id: p + '-f1', path: d + '-b/a.txt', contents: 'moved', previous_path: { string: d + '/papers/a.txt' } }],
    // A user deleted (version 7): a post sent after has no author name.
    ['UpsertUser', { id: u3, name: 'Gone', email: 'gone@example.com', dob: '1900-01-01' }],
    ['DeleteUser', { id: u3 }],
    ['UpsertPost', { id: p + '-p4', user_id: u3, title: 'Orphan', body: 'after the delete' }],
  ];
}

async function produce(brokers, topic, schemas, prefix) {
  const type = load(schemas + '/command.avsc');
  const fp = wireFingerprint(type);
  const kafka = new Kafka({ clientId: 'denorm-interop-js', brokers: brokers.split(','), logLevel: logLevel.WARN });
  // The Java client's partitioner (murmur2), as denorm's own producer uses.
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, idempotent: false });
  await producer.connect();
  try {
    let md = null;
    for (const [op, fields] of commands(prefix)) {
      const key = keyOf(op, fields);
      // An owner change's upsert names where its delete half landed (the
      // command just before it).
      const after = fields.previous_user_id || fields.previous_path ? { partition: md.partition, offset: Number(md.baseOffset) } : null;
      // One at a time: the order of a key's commands is the log order.
      [md] = await producer.send({ topic, acks: -1, messages: [{ key, value: encode(type, fp, op, fields, after) }] });
      console.log(JSON.stringify({ key, partition: md.partition, offset: Number(md.baseOffset) }));
    }
  } finally {
    await producer.disconnect();
  }
}

async function main(argv) {
  if (argv[0] === 'fingerprints') {
    const out = {};
    for (const f of argv.slice(1)) out[f] = wireFingerprint(load(f)).toString('hex');
    console.log(JSON.stringify(out));
  } else if (argv[0] === 'produce') {
    await produce(argv[1], argv[2], argv[3], argv[4]);
  } else {
    throw new Error('usage: see the header of ' + __filename);
  }
}

main(process.argv.slice(2)).catch((e) => { console.error(e); process.exit(1); });
