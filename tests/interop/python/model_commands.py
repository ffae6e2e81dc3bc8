"""A model's commands written and read with fastavro from the schema that
`denorm schema --model M` prints, and nothing else: the Python example of
docs/model.md, run by tests/it/interop.rs.

    python model_commands.py encode SCHEMA_FILE < JSONL   (prints hex messages, one a line)
    python model_commands.py decode SCHEMA_FILE < HEX     (prints JSONL lines)

A JSONL line is denorm's (docs/model.md, "Commands"):
{"op": "patch", "kind": "order", "id": "o1", "customer_id": "c1", "set": {...}}.
"""

import io
import json
import sys
import time
import uuid

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

OPS = {"upsert": "Upsert", "patch": "Patch", "delete": "Delete", "rename_prefix": "RenamePrefix"}


def load(path):
    with open(path) as f:
        raw = json.load(f)
    schema = parse_schema(raw, _write_hint=False)
    # The 8 bytes after C3 01: CRC-64-AVRO of the canonical form, little-endian.
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    return raw["namespace"], schema, fp


def encode(path):
    namespace, schema, fp = load(path)
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        op, kind, tenant = c.pop("op"), c.pop("kind"), c.pop("tenant", None)
        record = {
            "command_id": str(uuid.uuid4()),
            "issued_at": int(time.time() * 1000),
            "tenant": tenant,
            "after": None,
            "repair": None,
            # The payload's branch by its full name: the model's namespace,
            # the kind, the operation. Fields left out take their defaults
            # (null, or an empty nested list).
            "payload": (f"{namespace}.{kind}.{OPS[op]}", c),
        }
        buf = io.BytesIO()
        buf.write(b"\xc3\x01" + fp)
        fastavro.schemaless_writer(buf, schema, record)
        print(buf.getvalue().hex(), flush=True)


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
    {"encode": encode, "decode": decode}[sys.argv[1]](sys.argv[2])
