"""Validates model files against schemas/model.schema.json with the
reference JSON Schema implementation (python-jsonschema), as an editor
would: reads a JSON object {name: TOML text} on stdin, prints
{name: null | "the first error"}."""
import json
import sys
import tomllib

import jsonschema

schema = json.load(open("schemas/model.schema.json"))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
out = {}
for name, text in json.load(sys.stdin).items():
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        out[name] = f"TOML: {e}"
        continue
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    out[name] = None if not errors else f"{'.'.join(map(str, errors[0].absolute_path))}: {errors[0].message}"
json.dump(out, sys.stdout)
