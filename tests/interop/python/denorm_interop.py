"""A denorm producer and consumer written from schemas/ alone, with fastavro
and aiokafka: the Python example of docs/producers.md, run by
tests/it/interop.rs.

    python denorm_interop.py fingerprints SCHEMA_FILE...
    python denorm_interop.py produce BROKERS TOPIC SCHEMAS_DIR PREFIX [COMPRESSION]
    python denorm_interop.py decode BROKERS TOPIC SCHEMAS_DIR COUNT
    python denorm_interop.py send-lines BROKERS TOPIC FILE [COMPRESSION]
    python denorm_interop.py scram-user BROKERS CA_FILE USER PASSWORD

tansu 0.6 (the test broker) dies on the InitProducerId request that
aiokafka's idempotent producer sends, so idempotence is off here; against
Apache Kafka, turn it on (enable_idempotence=True).
"""

import asyncio
import io
import json
import sys
import time
import uuid

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


def load(path):
    with open(path) as f:
        return parse_schema(json.load(f), _write_hint=False)


def wire_fingerprint(schema):
    """The 8 bytes after C3 01: CRC-64-AVRO of the Parsing Canonical Form,
    little-endian (fastavro's hex string is already in that byte order)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def key_of(op, fields):
    """The ordering key: the top-level directory for file commands, the
    user id for user and post commands."""
    if op in ("UpsertFile", "DeleteFile"):
        return "/" + fields["path"].split("/")[1]
    if op == "RenamePath":
        return "/" + fields["from"].split("/")[1]
    if op in ("UpsertUser", "DeleteUser"):
        return fields["id"]
    return fields["user_id"]


def encode(schema, fp, op, fields, tenant=None, after=None):
    record = {
        "command_id": str(uuid.uuid4()),
        "issued_at": int(time.time() * 1000),
        "tenant": tenant,
        "after": after,
        # fastavro's tuple notation picks the union branch by name.
        "payload": ("denorm." + op, fields),
    }
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def commands(p):
    """Every command type: the same scenario in every language's test."""
    d, u, u2, u3 = f"/{p}", f"{p}-u1", f"{p}-u2", f"{p}-u3"
    return [
        ("UpsertFile", {"id": f"{p}-f1", "path": f"{d}/docs/a.txt", "contents": "alpha from " + p}),
        ("UpsertFile", {"id": f"{p}-f2", "path": f"{d}/docs/sub/b.txt", "contents": "beta"}),
        ("RenamePath", {"from": f"{d}/docs", "to": f"{d}/papers"}),
        ("DeleteFile", {"id": f"{p}-f2", "path": f"{d}/papers/sub/b.txt"}),
        ("UpsertUser", {"id": u, "name": "Ada Before", "email": "ada@example.com", "dob": "1815-12-10"}),
        ("UpsertPost", {"id": f"{p}-p1", "user_id": u, "title": "Notes", "body": "on the engine"}),
        ("UpsertPost", {"id": f"{p}-p2", "user_id": u, "title": "Draft", "body": "to delete"}),
        ("DeletePost", {"id": f"{p}-p2", "user_id": u}),
        ("UpsertUser", {"id": u, "name": f"Ada {p} After", "email": "ada@example.com", "dob": "1815-12-10"}),
        # An owner change: p1 goes to another user, in its two halves.
        ("UpsertUser", {"id": u2, "name": f"Grace {p}", "email": "grace@example.com", "dob": "1906-12-09"}),
        ("DeletePost", {"id": f"{p}-p1", "user_id": u}),
        ("UpsertPost", {"id": f"{p}-p1", "user_id": u2, "title": "Notes", "body": "on the engine", "previous_user_id": u}),
        # And f1 to another top-level directory.
        ("DeleteFile", {"id": f"{p}-f1", "path": f"{d}/papers/a.txt"}),
        ("UpsertFile", {"id": f"{p}-f1", "path": f"{d}-b/a.txt", "contents": "moved", "previous_path": f"{d}/papers/a.txt"}),
        # A user deleted (version 7): a post sent after has no author name.
        ("UpsertUser", {"id": u3, "name": "Gone", "email": "gone@example.com", "dob": "1900-01-01"}),
        ("DeleteUser", {"id": u3}),
        ("UpsertPost", {"id": f"{p}-p4", "user_id": u3, "title": "Orphan", "body": "after the delete"}),
    ]


async def produce(brokers, topic, schemas, prefix, compression=None):
    schema = load(f"{schemas}/command.avsc")
    fp = wire_fingerprint(schema)
    # compression: gzip, snappy, lz4 or zstd batches (cramjam's codecs).
    producer = AIOKafkaProducer(bootstrap_servers=brokers, acks="all", enable_idempotence=False, compression_type=compression)
    await producer.start()
    try:
        md = None
        for op, fields in commands(prefix):
            # Tenant acme's commands: keyed by the tenant, the unit
            # separator (0x1f), then the key (docs/producers.md).
            key = "acme\x1f" + key_of(op, fields)
            # An owner change's upsert names where its delete half landed
            # (the command just before it).
            owner_change = fields.get("previous_user_id") or fields.get("previous_path")
            after = {"partition": md.partition, "offset": md.offset} if owner_change else None
            # One at a time: the order of a key's commands is the log order.
            md = await producer.send_and_wait(topic, encode(schema, fp, op, fields, tenant="acme", after=after), key=key.encode())
            print(json.dumps({"key": key, "partition": md.partition, "offset": md.offset}), flush=True)
    finally:
        await producer.stop()


async def decode(brokers, topic, schemas, count):
    writer = load(f"{schemas}/command.avsc")
    fp = wire_fingerprint(writer)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=brokers, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        seen = 0
        async for m in consumer:
            v = m.value
            if v[:2] != b"\xc3\x01" or v[2:10] != fp:
                raise SystemExit(f"message at {m.partition}@{m.offset} is not single-object encoded with command.avsc: {v[:10].hex()}")
            r = fastavro.schemaless_reader(io.BytesIO(v[10:]), writer, return_record_name=True)
            name, payload = r["payload"]
            # fastavro reads timestamp-millis as an aware datetime.
            issued_at = round(r["issued_at"].timestamp() * 1000)
            # return_record_name gives a union's record as (name, record).
            after = r["after"][1] if isinstance(r["after"], tuple) else r["after"]
            repair = r["repair"][1] if isinstance(r["repair"], tuple) else r["repair"]
            print(json.dumps({"key": m.key.decode(), "partition": m.partition, "command_id": r["command_id"],
                              "issued_at": issued_at, "tenant": r["tenant"], "after": after, "repair": repair, "type": name, "payload": payload}),
                  flush=True)
            seen += 1
            if seen >= count:
                break
    finally:
        await consumer.stop()


async def send_lines(brokers, topic, path, compression=None):
    """Sends `key<TAB>hex bytes` lines in order (the Java encoder's output)."""
    producer = AIOKafkaProducer(bootstrap_servers=brokers, acks="all", enable_idempotence=False, compression_type=compression)
    await producer.start()
    try:
        with open(path) as f:
            for line in f:
                key, value = line.rstrip("\n").split("\t")
                md = await producer.send_and_wait(topic, bytes.fromhex(value), key=key.encode())
                print(json.dumps({"key": key, "partition": md.partition, "offset": md.offset}), flush=True)
    finally:
        await producer.stop()


def scram_user(brokers, ca, user, password):
    """Creates a SCRAM-SHA-256 and -512 user over TLS (no SASL: the broker
    does not require it yet) with librdkafka's own Python client."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    admin = AdminClient({"bootstrap.servers": brokers, "security.protocol": "SSL", "ssl.ca.location": ca})
    upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(m, 8192), password.encode())
               for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=30)
    print(json.dumps({"user": user, "mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"]}), flush=True)


def main(argv):
    if argv[:1] == ["fingerprints"]:
        print(json.dumps({f: wire_fingerprint(load(f)).hex() for f in argv[1:]}))
    elif argv[:1] == ["produce"]:
        asyncio.run(produce(argv[1], argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else None))
    elif argv[:1] == ["decode"]:
        asyncio.run(decode(argv[1], argv[2], argv[3], int(argv[4])))
    elif argv[:1] == ["send-lines"]:
        asyncio.run(send_lines(argv[1], argv[2], argv[3], argv[4] if len(argv) > 4 else None))
    elif argv[:1] == ["scram-user"]:
        scram_user(argv[1], argv[2], argv[3], argv[4])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
