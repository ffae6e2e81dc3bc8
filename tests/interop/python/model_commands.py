"""A model's commands written and read with fastavro from the schema that
`denorm schema --model M` prints, and nothing else: the Python example of
docs/model.md, run by tests/it/interop.rs.

    python model_commands.py encode SCHEMA_FILE < JSONL   (prints hex messages, one a line)
    python model_commands.py decode SCHEMA_FILE < HEX     (prints JSONL lines)
    python model_commands.py produce SCHEMA_FILE MODEL_FILE BROKERS TOPIC < JSONL
                                                          (prints a delivery a line)

A JSONL line is denorm's (docs/model.md, "Commands"):
{"op": "patch", "kind": "order", "id": "o1", "customer_id": "c1", "set": {...}}.
"""

import asyncio
import io
import json
import sys
import time
import tomllib
import uuid

import fastavro
from aiokafka import AIOKafkaProducer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

OPS = {"upsert": "Upsert", "patch": "Patch", "delete": "Delete", "rename_prefix": "RenamePrefix"}


def load(path):
    with open(path) as f:
        raw = json.load(f)
    schema = parse_schema(raw, _write_hint=False)
    # The 8 bytes after C3 01: CRC-64-AVRO of the canonical form, little-endian.
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    return raw["namespace"], schema, fp


def message(namespace, schema, fp, op, kind, tenant, payload, after=None):
    record = {
        "command_id": str(uuid.uuid4()),
        "issued_at": int(time.time() * 1000),
        "tenant": tenant,
        "after": after,
        "repair": None,
        # The payload's branch by its full name: the model's namespace,
        # the kind, the operation. Fields left out take their defaults
        # (null, or an empty nested list).
        "payload": (f"{namespace}.{kind}.{OPS[op]}", payload),
    }
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def lines():
    for line in sys.stdin:
        if line.strip():
            c = json.loads(line)
            yield c.pop("op"), c.pop("kind"), c.pop("tenant", None), c


def encode(path):
    namespace, schema, fp = load(path)
    for op, kind, tenant, c in lines():
        print(message(namespace, schema, fp, op, kind, tenant, c).hex(), flush=True)


def top(path):
    return "/" + path.split("/")[1]


def key_field(model, kind):
    """The field a kind is keyed by (None: its own id), and whether it is a
    path, from the model file's `key` (docs/model.md, "The ordering key")."""
    key = model["kinds"][kind]["key"]
    if key == "id":
        return None, False
    if "owner" in key:
        return key["owner"], False
    return key["path"], True


def key_of(model, op, kind, c):
    """The Kafka key of a command: its ordering key, after its tenant and
    the unit separator (0x1f) for a tenant's command."""
    field, is_path = key_field(model, kind)
    if op == "rename_prefix":
        return top(c["from"])
    if field is None:
        return c["id"]
    value = c["fields"][field] if op == "upsert" else c[field]
    return top(value) if is_path else value


async def produce(path, model_path, brokers, topic):
    namespace, schema, fp = load(path)
    with open(model_path, "rb") as f:
        model = tomllib.load(f)
    producer = AIOKafkaProducer(bootstrap_servers=brokers, acks="all", enable_idempotence=False)
    await producer.start()

    async def send(op, kind, tenant, c, after=None):
        key = key_of(model, op, kind, c)
        key = f"{tenant}\x1f{key}" if tenant else key
        # One at a time: the order of a key's commands is the log order.
        md = await producer.send_and_wait(topic, message(namespace, schema, fp, op, kind, tenant, c, after), key=key.encode())
        print(json.dumps({"key": key, "partition": md.partition, "offset": md.offset}), flush=True)
        return md

    try:
        for op, kind, tenant, c in lines():
            field, _ = key_field(model, kind)
            previous = c.get(f"previous_{field}") if field and op == "upsert" else None
            if previous is None:
                await send(op, kind, tenant, c)
                continue
            # An owner change: the document's delete under the key it
            # leaves, then its upsert, naming where that delete landed.
            md = await send("delete", kind, tenant, {"id": c["id"], field: previous})
            await send(op, kind, tenant, c, after={"partition": md.partition, "offset": md.offset})
    finally:
        await producer.stop()


def without_nulls(v):
    if isinstance(v, dict):
        return {k: without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [without_nulls(x) for x in v]
    return v


def decode(path):
    namespace, schema, fp = load(path)
    names = {v: k for k, v in OPS.items()}
    for line in sys.stdin:
        v = bytes.fromhex(line.strip())
        if v[:2] != b"\xc3\x01" or v[2:10] != fp:
            raise SystemExit(f"not single-object encoded with this schema: {v[:10].hex()}")
        r = fastavro.schemaless_reader(io.BytesIO(v[10:]), schema, return_record_name=True)
        name, payload = r["payload"]
        kind, op = name[len(namespace) + 1:].split(".")
        out = {"op": names[op], "kind": kind}
        if r["tenant"] is not None:
            out["tenant"] = r["tenant"]
        out.update(without_nulls(payload))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        asyncio.run(produce(*sys.argv[2:6]))
    else:
        {"encode": encode, "decode": decode}[sys.argv[1]](sys.argv[2])
