#!/usr/bin/env python3
"""Validates docker-compose.yml against the Compose specification's JSON
schema (shipped in the docker-compose 1.29.2 wheel, cached under
~/.cache/denorm) and checks what the schema cannot: referenced files exist,
depends_on names services, published ports are loopback-only."""
import os, subprocess, sys, zipfile, json, pathlib

root = pathlib.Path(__file__).resolve().parent.parent
cache = pathlib.Path.home() / ".cache" / "denorm" / "compose-spec"
failed = []

def need(module, package):
    try:
        return __import__(module)
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", package])
        return __import__(module)

yaml = need("yaml", "pyyaml")
jsonschema = need("jsonschema", "jsonschema")

schema_path = cache / "compose_spec.json"
if not schema_path.exists():
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), "docker-compose==1.29.2"])
    wheel = next(cache.glob("docker_compose-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        schema_path.write_bytes(z.read("compose/config/compose_spec.json"))

compose = yaml.safe_load((root / "docker-compose.yml").read_text())
schema = json.loads(schema_path.read_text())
# The top-level `name` key is newer than this schema; everything else is checked.
body = {k: v for k, v in compose.items() if k != "name"}
errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=lambda e: list(e.path))
for e in errors:
    failed.append(f"schema: {'/'.join(map(str, e.path))}: {e.message}")

services = compose.get("services", {})
for name, svc in services.items():
    deps = svc.get("depends_on", {})
    for dep in (deps if isinstance(deps, list) else deps.keys()):
        if dep not in services:
            failed.append(f"{name}: depends_on unknown service {dep}")
    for vol in svc.get("volumes", []):
        src = vol.split(":")[0]
        if src.startswith("./") and not (root / src).exists():
            failed.append(f"{name}: volume source {src} does not exist")
    for port in svc.get("ports", []):
        if not str(port).startswith("127.0.0.1:"):
            failed.append(f"{name}: port {port} is not bound to loopback")
    if svc.get("build") and not (root / "Dockerfile").exists():
        failed.append(f"{name}: builds from a missing Dockerfile")
for needed in ["kafka", "topic-init", "elasticsearch", "worker-1", "worker-2", "seed", "prometheus", "grafana"]:
    if needed not in services:
        failed.append(f"missing service {needed}")

dockerfile = (root / "Dockerfile").read_text()
if "\nUSER " not in dockerfile or dockerfile.count("FROM ") < 2:
    failed.append("Dockerfile must be multi-stage with a non-root USER")

for f in failed:
    print(f"docker-compose.yml check FAILED: {f}")
if not failed:
    print("docker-compose.yml and Dockerfile: schema and references OK")
sys.exit(1 if failed else 0)
