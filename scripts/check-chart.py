#!/usr/bin/env python3
"""Validates the Helm chart in helm/denorm offline, with parts this project
did not write:

  - the real Helm v4 engine (helm-python-sdk): `lint --strict` and render for
    every values file in helm/denorm/ci, plus values the chart must refuse;
  - Kubernetes' OpenAPI schemas of the versions in KUBE_VERSIONS
    (kubernetes-validate, strict: unknown fields fail);
  - KEDA and Prometheus Operator objects against their CRD schemas, vendored
    in tests/k8s/crd-schemas (strict as well);
  - checkov's Kubernetes policies: no failed check but the SKIPS below;
  - promtool: the PrometheusRule's rules are checked and unit-tested
    (tests/k8s/alerts-test.yml);
  - the denorm binary: every DENORM_* variable a container gets is one its
    subcommand reads (`denorm <command> --help`), and with DENORM_TEST_BROKERS
    the embedded values' topics hook and worker run as rendered until ready.

Usage: check-chart.py DENORM_BINARY [--boot NAME]

With --boot NAME, only helm/denorm/ci/NAME-values.yaml is rendered and its
topics hook and worker booted against DENORM_TEST_BROKERS, their Secrets
read from DENORM_TEST_SECRETS/<secret name>/<key> (tests/it/transport.rs
boots the SASL_SSL values so).
Installs its Python packages once into $HOME/.cache/denorm/k8s."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "denorm"
VENV = pathlib.Path(os.environ.get("DENORM_K8S_TOOLS", pathlib.Path.home() / ".cache" / "denorm" / "k8s"))
PACKAGES = ["helm-python-sdk==0.2.2", "kubernetes-validate==1.37.0", "checkov==3.3.30", "pyyaml==6.0.3", "jsonschema==4.26.0"]
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion is >=1.25;
# 1.30 is the oldest still maintained by the big providers) and the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ["1.30.0", "1.37.0"]
NAMESPACE = "search"
# checkov policies skipped, each with its reason.
SKIPS = {
    "CKV_K8S_11": "no CPU limit by default: CFS throttling stalls a throughput-bound worker and its heartbeats; "
    "requests are set, and resources.limits.cpu can be set in values",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: tags are immutable releases, and image.digest pins an image",
    "CKV_K8S_43": "images by tag by default (image.digest is supported and used in ci/elasticsearch-values.yaml)",
}


def venv_python():
    py = VENV / "bin" / "python"
    stamp = VENV / (".installed-" + "-".join(p.replace("==", "_") for p in PACKAGES))
    if not stamp.exists():
        print(f"installing {', '.join(PACKAGES)} into {VENV}", file=sys.stderr)
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
        subprocess.check_call([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PACKAGES])
        stamp.touch()
    return py


if __name__ == "__main__" and os.environ.get("DENORM_CHECK_CHART_IN_VENV") != "1":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--boot"):
        sys.exit(__doc__)
    py = venv_python()
    env = dict(os.environ, DENORM_CHECK_CHART_IN_VENV="1")
    sys.exit(subprocess.call([str(py), __file__, *sys.argv[1:]], env=env))

# From here on, inside the virtualenv.
import helm_python as helm  # noqa: E402
import jsonschema  # noqa: E402
import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

BINARY = pathlib.Path(sys.argv[1]).resolve()
failed = []


def fail(msg):
    failed.append(msg)
    print(f"FAIL {msg}", file=sys.stderr)


def render(chart, values):
    out = chart.render(values, name="denorm", namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    return docs


# --- Kubernetes and CRD schemas ---------------------------------------------

def strict(schema):
    """Unknown fields fail, as kubernetes-validate's strict mode does (the API
    server would silently prune them)."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
            schema = dict(schema, additionalProperties=False)
        return {k: strict(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


# (apiVersion, kind) -> strict validator, from files named like
# keda.sh_v1alpha1_ScaledObject.json.
CRD_VALIDATORS = {}
for f in (ROOT / "tests" / "k8s" / "crd-schemas").glob("*.json"):
    group, version, kind = f.stem.split("_")
    CRD_VALIDATORS[(f"{group}/{version}", kind)] = jsonschema.Draft202012Validator(strict(json.loads(f.read_text())))


def validate_object(name, doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_VALIDATORS:
        for e in CRD_VALIDATORS[key].iter_errors(doc):
            fail(f"{name}: {key[1]} {'/'.join(map(str, e.absolute_path))}: {e.message}")
        return f"{key[1]} (CRD schema)"
    for v in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{name}: {key[1]} on Kubernetes {v}: {'/'.join(map(str, e.path))}: {e.message}")
        except Exception as e:  # an unknown kind or version
            fail(f"{name}: {key[1]} on Kubernetes {v}: {e}")
    return key[1]


# --- Environment variables against the binary --------------------------------

HELP_CACHE = {}


def env_names_read_by(command):
    if command not in HELP_CACHE:
        text = subprocess.run([str(BINARY), "--help"], capture_output=True, text=True, check=True).stdout
        text += subprocess.run([str(BINARY), command, "--help"], capture_output=True, text=True, check=True).stdout
        HELP_CACHE[command] = set(re.findall(r"\bDENORM_[A-Z0-9_]+\b", text))
    return HELP_CACHE[command]


def pod_spec(doc):
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return spec["template"]["spec"]
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return None


def check_env(name, doc):
    pod = pod_spec(doc)
    if pod is None:
        return
    for c in pod["containers"]:
        command = c["args"][0]
        known = env_names_read_by(command)
        for e in c.get("env", []):
            if e["name"] not in known:
                fail(f"{name}: {doc['kind']} container {c['name']} sets {e['name']}, which `denorm {command}` does not read")
            if re.search(r"PASSWORD|API_KEY|SECRET", e["name"]) and not e["name"].endswith("_FILE"):
                fail(f"{name}: {e['name']} carries a secret in the environment; use its _FILE variable")
        if not c["securityContext"].get("readOnlyRootFilesystem"):
            fail(f"{name}: container {c['name']} has a writable root filesystem")


# --- Invariants the schemas cannot express -----------------------------------

ROLES = {"run": "worker", "topics": "topics", "rebuild": "rebuild", "verify": "verify"}


def check_roles(name, values, docs):
    """Each role's pods mount their own Secrets (jobs.<role>.kafkaSecret and
    elasticsearchSecret over the workers'), the topics Job no Elasticsearch
    credential and no signing keys, and a variable names each Secret mounted."""
    jobs = values.get("jobs", {})
    es_auth = values.get("backend") == "elasticsearch" and values["elasticsearch"]["auth"]["type"] != "none"
    for _, d in docs:
        pod = pod_spec(d)
        if pod is None:
            continue
        role = ROLES[pod["containers"][0]["args"][0]]
        own = jobs.get(role, {}) if role != "worker" else {}
        want = {
            "kafka-options": own.get("kafkaSecret") or values["kafka"]["existingSecret"],
            "elasticsearch-auth": (own.get("elasticsearchSecret") or values["elasticsearch"]["auth"]["existingSecret"]) if es_auth and role != "topics" else "",
            "signing-keys": values["signing"]["existingSecret"] if role != "topics" else "",
        }
        got = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        env = {e["name"] for e in pod["containers"][0]["env"]}
        for volume, secret in want.items():
            if got.get(volume, "") != secret:
                fail(f"{name}: the {role} pod ({d['kind']}) mounts {got.get(volume) or 'no Secret'} as {volume}, not {secret or 'none'}")
        for volume, var in [("kafka-options", "DENORM_KAFKA_OPTIONS_FILE"), ("signing-keys", "DENORM_SIGNING_KEY_FILE")]:
            if bool(want[volume]) != (var in env):
                fail(f"{name}: the {role} pod sets {var} {'without' if var in env else 'but not'} its Secret")
        if role == "topics" and any(n.startswith("DENORM_ES_") and n.endswith("_FILE") for n in env):
            fail(f"{name}: the topics Job is given an Elasticsearch credential")

def check_invariants(name, values, docs):
    by_kind = {}
    for _, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    partitions = values["kafka"]["partitions"]
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    if len(workloads) != 1:
        return fail(f"{name}: expected one worker Deployment or StatefulSet, got {len(workloads)}")
    w = workloads[0]
    env = {e["name"]: e for e in w["spec"]["template"]["spec"]["containers"][0]["env"]}
    embedded = values.get("backend") == "embedded"
    static = embedded or values.get("staticMembership", {}).get("enabled")
    if static:
        if w["kind"] != "StatefulSet":
            fail(f"{name}: static membership needs a StatefulSet")
        if env.get("DENORM_INSTANCE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
            fail(f"{name}: DENORM_INSTANCE_ID is not the pod name")
    elif "DENORM_INSTANCE_ID" in env:
        fail(f"{name}: a Deployment's pods must not share static instance ids")
    if embedded:
        if w["spec"].get("replicas") != 1 or not w["spec"].get("volumeClaimTemplates"):
            fail(f"{name}: the embedded backend needs one replica and a volume")
    if "replicas" in w["spec"] and w["spec"]["replicas"] > partitions:
        fail(f"{name}: {w['spec']['replicas']} replicas for {partitions} partitions")
    grace = w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    shutdown = int(env["DENORM_SHUTDOWN_TIMEOUT_SECS"]["value"])
    if grace <= shutdown:
        fail(f"{name}: terminationGracePeriodSeconds {grace} is not above the shutdown timeout {shutdown}")
    worker_grace = int(env["DENORM_SHUTDOWN_GRACE_SECS"]["value"])
    if not shutdown <= worker_grace <= grace:
        fail(f"{name}: the worker's shutdown grace {worker_grace} is not between its shutdown timeout {shutdown} and the pod's grace {grace}")
    if grace > 2 and worker_grace >= grace:
        fail(f"{name}: the worker's shutdown grace {worker_grace} leaves no time before the pod's grace {grace} ends")
    probes = w["spec"]["template"]["spec"]["containers"][0]
    if probes["livenessProbe"]["httpGet"]["path"] != "/healthz" or probes["readinessProbe"]["httpGet"]["path"] != "/readyz":
        fail(f"{name}: probes are not /healthz and /readyz")
    for so in by_kind.get("ScaledObject", []):
        if so["spec"]["maxReplicaCount"] > partitions:
            fail(f"{name}: ScaledObject maxReplicaCount {so['spec']['maxReplicaCount']} above {partitions} partitions")
        if so["spec"]["scaleTargetRef"]["kind"] != w["kind"] or so["spec"]["scaleTargetRef"]["name"] != w["metadata"]["name"]:
            fail(f"{name}: the ScaledObject does not target the workers")
        if "replicas" in w["spec"]:
            fail(f"{name}: with autoscaling the workload must not set replicas (KEDA owns them)")
        for t in so["spec"]["triggers"]:
            want = "prometheus" if values.get("autoscaling", {}).get("prometheus", {}).get("serverAddress") else "kafka"
            if t["type"] != want:
                fail(f"{name}: the ScaledObject's trigger is {t['type']}, not {want}")
            if t["type"] == "prometheus" and "denorm_partition_unapplied_commands{" not in t["metadata"]["query"]:
                fail(f"{name}: the Prometheus trigger does not scale on the commands not applied yet: {t['metadata']['query']}")
    if values.get("podDisruptionBudget", {}).get("enabled", True) and not by_kind.get("PodDisruptionBudget"):
        fail(f"{name}: no PodDisruptionBudget")
    for cm in by_kind.get("ConfigMap", []):
        if "denorm.json" in cm.get("data", {}):
            json.loads(cm["data"]["denorm.json"])
    model = values.get("model", {}).get("file")
    for _, d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
            continue
        c = pod_spec(d)["containers"][0]
        given = {e["name"]: e.get("value") for e in c["env"]}.get("DENORM_MODEL")
        own = values.get("jobs", {}).get("rebuild", {}).get("modelFile") if c["args"][0] == "rebuild" else None
        file = own or model
        want = f"/etc/denorm/model/{file}" if file and c["args"][0] != "topics" else None
        if given != want:
            fail(f"{name}: {d['kind']} {d['metadata']['name']} ({c['args'][0]}) has DENORM_MODEL={given!r}, not {want!r}")
    rebuild = values.get("jobs", {}).get("rebuild", {})
    for job in by_kind.get("Job", []):
        c = pod_spec(job)["containers"][0]
        if c["args"][0] == "rebuild":
            want = str(bool(rebuild.get("verify"))).lower()
            got = {e["name"]: e.get("value") for e in c["env"]}.get("DENORM_REBUILD_VERIFY")
            if got != want:
                fail(f"{name}: jobs.rebuild.verify is {rebuild.get('verify')}, the rebuild Job sets DENORM_REBUILD_VERIFY={got!r}")
    for job in by_kind.get("Job", []):
        c = pod_spec(job)["containers"][0]
        if c["args"][0] == "rebuild":
            check_members(name, "rebuild Job", job["spec"], c, "DENORM_REBUILD", rebuild.get("members", 1))
    verify = values.get("jobs", {}).get("verify", {})
    cronjobs = by_kind.get("CronJob", [])
    for cj in cronjobs:
        spec = cj["spec"]["jobTemplate"]["spec"]
        c = pod_spec(cj)["containers"][0]
        members = verify.get("members", 1)
        check_members(name, "verify CronJob", spec, c, "DENORM_VERIFY", members)
        run = next((e for e in c["env"] if e["name"] == "DENORM_VERIFY_RUN"), None)
        if members > 1 and (run is None or "job-name" not in run.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")):
            fail(f"{name}: the verify CronJob's {members} members share no run name (DENORM_VERIFY_RUN from the Job's name): {run}")
        rules = spec.get("podFailurePolicy", {}).get("rules", [])
        fails_index = any(r["action"] == "FailIndex" and sorted(r.get("onExitCodes", {}).get("values", [])) == [1, 2] for r in rules)
        if not (fails_index and spec.get("backoffLimitPerIndex", 0) >= 1):
            fail(f"{name}: the verify CronJob must retry a killed member (backoffLimitPerIndex) and fail only its index on exit 1 or 2: {spec}")
    if bool(verify.get("enabled")) != bool(cronjobs):
        fail(f"{name}: jobs.verify.enabled is {verify.get('enabled')}, CronJobs rendered: {len(cronjobs)}")
    for cj in cronjobs:
        pod = pod_spec(cj)
        c = pod["containers"][0]
        cenv = {e["name"]: e.get("value") for e in c["env"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        scratch = cenv.get("DENORM_VERIFY_SCRATCH_DIR", "")
        mount = next((p for p in mounts if scratch.startswith(p + "/")), None)
        args = ["verify", "--json"] + (["--repair"] if verify.get("repair") else [])
        if c["args"] != args or cj["spec"]["concurrencyPolicy"] != "Forbid" or pod["restartPolicy"] != "Never":
            fail(f"{name}: the verify CronJob runs {c['args']} with concurrencyPolicy {cj['spec']['concurrencyPolicy']}")
        if mount is None or "emptyDir" not in volumes.get(mounts[mount], {}):
            fail(f"{name}: the verify scratch directory {scratch!r} is not on an emptyDir of its own")
        # Review of verify F11: the deadline covers the whole run (two
        # rounds' replays; with repair, the wait for the workers and the
        # second verify's two rounds), not the first replay only.
        timeout = verify.get("timeoutSecs", 3600)
        need = timeout * (5 if verify.get("repair") else 2)
        deadline = cj["spec"]["jobTemplate"]["spec"].get("activeDeadlineSeconds", 0)
        if deadline < need:
            fail(f"{name}: the verify CronJob's deadline {deadline} s is below what a run may take ({need} s with timeoutSecs {timeout}, repair {verify.get('repair', False)})")
        sample = verify.get("samplePercent", 100)
        if sample < 100 and cenv.get("DENORM_VERIFY_SAMPLE") != str(sample):
            fail(f"{name}: samplePercent {sample} is not passed as DENORM_VERIFY_SAMPLE: {cenv}")
        # Review of verify F8: a sample rotates (daily by default).
        rotation = str(verify.get("sampleRotation", "daily"))
        if sample < 100 and cenv.get("DENORM_VERIFY_SAMPLE_ROTATION") != rotation:
            fail(f"{name}: sampleRotation {rotation} is not passed as DENORM_VERIFY_SAMPLE_ROTATION: {cenv}")


def check_members(name, what, spec, c, prefix, members):
    """An Indexed Job with one pod per member, each told how many and which."""
    env = {e["name"]: e for e in c["env"]}
    index = env.get(f"{prefix}_MEMBER", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
    if (spec.get("completionMode"), spec.get("completions"), spec.get("parallelism")) != ("Indexed", members, members):
        fail(f"{name}: the {what} has {members} member(s) but runs completionMode {spec.get('completionMode')}, completions {spec.get('completions')}, parallelism {spec.get('parallelism')}")
    if members == 1 and f"{prefix}_MEMBERS" not in env and f"{prefix}_MEMBER" not in env:
        return  # one process: the command's default
    if env.get(f"{prefix}_MEMBERS", {}).get("value") != str(members) or "job-completion-index" not in index:
        fail(f"{name}: the {what}'s pods are not told {prefix}_MEMBERS={members} and their index: {env}")


# --- Alerts -------------------------------------------------------------------

def check_alerts(name, docs, workdir):
    rules = [d for _, d in docs if d["kind"] == "PrometheusRule"]
    if not rules:
        return
    promtool = shutil.which("promtool")
    if not promtool:
        return fail("promtool is not installed (Debian package prometheus): the alerts cannot be checked")
    path = workdir / f"{name}-rules.yml"
    path.write_text(yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    if r.returncode:
        fail(f"{name}: promtool check rules: {r.stdout}{r.stderr}")
    # The unit tests are written for the release and namespace rendered here
    # and ci/elasticsearch-values.yaml's thresholds.
    if name == "elasticsearch":
        test = workdir / "alerts-test.yml"
        text = (ROOT / "tests" / "k8s" / "alerts-test.yml").read_text().replace("RULES_FILE", str(path))
        test.write_text(text)
        r = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True)
        if r.returncode:
            fail(f"{name}: promtool test rules: {r.stdout}{r.stderr}")
        else:
            print(f"  alerts: promtool unit tests pass ({text.count('alertname:')} alert expectations)")


# --- The rendered environment boots the real worker ---------------------------

def container_env(doc, command):
    for c in pod_spec(doc)["containers"]:
        if c["args"][0] == command:
            return {e["name"]: e for e in c["env"]}
    raise KeyError(command)


def boot(name, docs, brokers, workdir):
    """Runs the topic hook's and the worker's containers as rendered (their
    args and env; only the broker address, the topic, the index path and the
    metrics port are swapped for local ones) and waits for /readyz."""
    import socket
    import time
    import urllib.request
    import uuid

    jobs = [d for _, d in docs if d["kind"] == "Job"]
    workload = next(d for _, d in docs if d["kind"] in ("Deployment", "StatefulSet"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topic = f"chart-{uuid.uuid4().hex[:12]}"

    secrets = os.environ.get("DENORM_TEST_SECRETS")
    # The rendered ConfigMaps, written out as the kubelet mounts them.
    configmaps = workdir / "configmaps"
    for _, d in docs:
        if d["kind"] == "ConfigMap":
            for key, text in d.get("data", {}).items():
                (configmaps / d["metadata"]["name"]).mkdir(parents=True, exist_ok=True)
                (configmaps / d["metadata"]["name"] / key).write_text(text)

    def local(doc, value):
        """A path in a mounted Secret or ConfigMap, as its local copy."""
        pod = pod_spec(doc)
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for m in pod["containers"][0].get("volumeMounts", []):
            if not value.startswith(m["mountPath"] + "/"):
                continue
            rest = value[len(m["mountPath"]) + 1:]
            secret = volumes.get(m["name"], {}).get("secret")
            configmap = volumes.get(m["name"], {}).get("configMap")
            if secret and secrets:
                return str(pathlib.Path(secrets) / secret["secretName"] / rest)
            if configmap:
                if not (configmaps / configmap["name"] / rest).exists():
                    fail(f"{name}: {value} is in ConfigMap {configmap['name']}, which does not hold {rest}")
                return str(configmaps / configmap["name"] / rest)
        return value

    def env_of(doc, command):
        out = {}
        for n, e in container_env(doc, command).items():
            if "value" in e and n == "DENORM_KAFKA_OPTIONS":
                out[n] = ";".join(o.split("=", 1)[0] + "=" + local(doc, o.split("=", 1)[1]) for o in e["value"].split(";"))
            elif "value" in e:
                out[n] = local(doc, e["value"])
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                out[n] = f"{workload['metadata']['name']}-0"
            else:
                fail(f"{name}: cannot resolve {n} locally: {e}")
        out.update(DENORM_BROKERS=brokers, DENORM_TOPIC=topic, DENORM_INDEX=str(workdir / "index"))
        if "DENORM_METRICS_ADDR" in out:
            out["DENORM_METRICS_ADDR"] = f"127.0.0.1:{port}"
        return {**{k: v for k, v in os.environ.items() if not k.startswith("DENORM_")}, **out}

    topics_job = next(j for j in jobs if j["metadata"]["name"].endswith("-topics"))
    r = subprocess.run([str(BINARY), "topics"], env=env_of(topics_job, "topics"), capture_output=True, text=True, timeout=120)
    if r.returncode:
        return fail(f"{name}: the topics hook's command failed: {r.stderr}")
    log = open(workdir / "worker.log", "w+")
    worker = subprocess.Popen([str(BINARY), "run"], env=env_of(workload, "run"), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if worker.poll() is not None or time.time() > deadline:
                log.seek(0)
                return fail(f"{name}: the rendered worker never became ready:\n{log.read()[-3000:]}")
            time.sleep(0.2)
        worker.terminate()
        code = worker.wait(timeout=int(container_env(workload, "run")["DENORM_SHUTDOWN_TIMEOUT_SECS"]["value"]) + 30)
        log.seek(0)
        text = log.read()
        if code != 0:
            return fail(f"{name}: the worker exited {code} on SIGTERM:\n{text[-3000:]}")
        if "DENORM_MODEL" in container_env(workload, "run") and "applying the model's commands" not in text:
            fail(f"{name}: the worker was given a model and did not apply it:\n{text[-3000:]}")
        if workload["kind"] == "StatefulSet" and "static group membership" not in text:
            fail(f"{name}: the worker did not use its pod name as instance id:\n{text[-3000:]}")
        print(f"{name}: the rendered topics hook and worker ran against the test broker: ready, then a clean SIGTERM stop")
        return text
    finally:
        if worker.poll() is None:
            worker.kill()


# --- checkov --------------------------------------------------------------------

def run_checkov(manifest_dir):
    checkov = VENV / "bin" / "checkov"
    r = subprocess.run(
        [str(checkov), "-d", str(manifest_dir), "--framework", "kubernetes", "--output", "json", "--quiet", "--compact",
         "--skip-check", ",".join(SKIPS)],
        capture_output=True, text=True, env=dict(os.environ, BC_SKIP_MAPPING="TRUE", CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false"),
    )
    try:
        reports = json.loads(r.stdout)
    except json.JSONDecodeError:
        return fail(f"checkov did not report JSON (exit {r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
    reports = reports if isinstance(reports, list) else [reports]
    passed = failed_checks = 0
    for rep in reports:
        summary = rep.get("summary", {})
        passed += summary.get("passed", 0)
        failed_checks += summary.get("failed", 0)
        if summary.get("parsing_errors"):
            fail(f"checkov could not parse {summary['parsing_errors']} manifest(s)")
        for c in rep.get("results", {}).get("failed_checks", []):
            fail(f"checkov {c['check_id']} ({c['check_name']}) on {c['resource']} in {pathlib.Path(c['file_path']).name}")
    if passed == 0:
        fail("checkov passed no check at all: it did not scan the manifests")
    print(f"checkov: {passed} checks passed, {failed_checks} failed; skipped: "
          + "; ".join(f"{k} ({v})" for k, v in SKIPS.items()))


# --- Values the chart must refuse ----------------------------------------------

MUST_FAIL = [
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "jobs": {"rebuild": {"enabled": True, "verify": True, "changeModel": True}}}, "refused with jobs.rebuild.changeModel"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "jobs": {"rebuild": {"modelFile": "shop-v2.toml"}}}, "holds no model to change"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "model": {"file": "shop.toml", "files": {"shop.toml": "x"}}, "jobs": {"rebuild": {"modelFile": "shop-v2.toml"}}}, "jobs.rebuild.modelFile shop-v2.toml is not a file of model.files (shop.toml)"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "model": {"file": "shop.toml"}}, "model.file needs its file"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "model": {"file": "shop.toml", "files": {"shop-v1.toml": "x"}}}, "model.file shop.toml is not a file of model.files (shop-v1.toml)"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "model": {"files": {"shop.toml": "x"}}}, "model.files without model.file"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "model": {"file": "shop.toml", "files": {"shop.toml": "x"}, "existingConfigMap": "m"}}, "set one"),
    ({"kafka": {"brokers": ""}, "elasticsearch": {"url": "http://es:9200"}}, "kafka.brokers is required"),
    ({"kafka": {"brokers": "k:9092"}}, "elasticsearch.url is required"),
    ({"backend": "embedded", "kafka": {"brokers": "k:9092"}, "autoscaling": {"enabled": True}}, "autoscaling needs backend elasticsearch"),
    ({"backend": "embedded", "kafka": {"brokers": "k:9092"}, "jobs": {"rebuild": {"enabled": True}}}, "rebuild Job needs backend elasticsearch"),
    ({"backend": "embedded", "kafka": {"brokers": "k:9092"}, "jobs": {"verify": {"enabled": True}}}, "verify CronJob needs backend elasticsearch"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "jobs": {"verify": {"enabled": True, "samplePercent": 0}}}, "samplePercent"),
    ({"kafka": {"brokers": "k:9092", "options": {"sasl.password": "x"}}, "elasticsearch": {"url": "http://es:9200"}}, "looks like a secret"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200", "auth": {"type": "basic"}}}, "existingSecret is required"),
    ({"backend": "opensearch", "kafka": {"brokers": "k:9092"}}, "backend"),
    ({"replicaCount": "three", "kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}}, "replicaCount"),
    ({"kafka": {"brokers": "k:9092", "partitions": 0}, "elasticsearch": {"url": "http://es:9200"}}, "partitions"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "worker": {"onAbort": "drop"}}, "onAbort"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "worker": {"sessionTimeoutMs": 500}}, "sessionTimeoutMs"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200"}, "elasticsearch_password": "x"}, "elasticsearch_password"),
    ({"kafka": {"brokers": "k:9092", "options": {"client.id": "a;b"}}, "elasticsearch": {"url": "http://es:9200"}}, "options"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://user:pw@es:9200"}}, "url"),
    ({"kafka": {"brokers": "k:9092"}, "elasticsearch": {"url": "http://es:9200", "prefix": "search-t-acme"}}, "prefix"),
    ({"kafka": {"brokers": "k:9092", "partitions": 12}, "elasticsearch": {"url": "http://es:9200"}, "worker": {"spillMb": 256, "spillVolumeSize": "2Gi"}}, "below worker.spillMb (256) times kafka.partitions (12)"),
    ({"kafka": {"brokers": "k:9092", "partitions": 2}, "elasticsearch": {"url": "http://es:9200"}, "worker": {"spillMb": 1, "spillVolumeSize": "1023Ki"}}, "below worker.spillMb (1) times kafka.partitions (2)"),
]


# Values documented as a whole rather than key by key.
OPAQUE = {"resources", "podSecurityContext", "securityContext", "livenessProbe", "readinessProbe", "startupProbe",
          "labels", "options", "nodeSelector", "affinity", "podAnnotations", "podLabels", "annotations"}


def value_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in OPAQUE:
            yield from value_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def check_readme():
    """Every value has its row in the chart README's table, and every row a value."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = set(re.findall(r"^\| `([^`]+)` \|", (CHART / "README.md").read_text(), re.M))
    keys = set(value_keys(values))
    for k in sorted(keys - rows):
        fail(f"helm/denorm/README.md: no row for the value {k}")
    for k in sorted(rows - keys):
        fail(f"helm/denorm/README.md: a row for {k}, which values.yaml does not have")
    print(f"chart README documents all {len(keys)} values")


def boot_only(name):
    chart = helm.Chart.load(str(CHART))
    values = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        boot(name, render(chart, values), os.environ["DENORM_TEST_BROKERS"], pathlib.Path(tmp))
    if failed:
        sys.exit(1)


def main():
    if len(sys.argv) == 4:
        return boot_only(sys.argv[3])
    check_readme()
    chart = helm.Chart.load(str(CHART))
    print(f"Helm {helm.helm_sdk_version()} (helm-python-sdk), chart {chart.name} {chart.version}")
    values_files = sorted((CHART / "ci").glob("*-values.yaml"))
    if len(values_files) < 4:
        fail(f"only {len(values_files)} values files in {CHART / 'ci'}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for vf in values_files:
            name = vf.name.removesuffix("-values.yaml")
            values = yaml.safe_load(vf.read_text())
            report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v" + KUBE_VERSIONS[0])
            for m in report.get("messages", []):
                if m["severity"] >= 2:
                    fail(f"{name}: helm lint: {m['path']}: {m['error']}")
            for e in report.get("errors", []):
                fail(f"{name}: helm lint: {e}")
            try:
                docs = render(chart, values)
            except helm.HelmError as e:
                fail(f"{name}: render: {e}")
                continue
            kinds = [validate_object(name, d) for _, d in docs]
            for _, d in docs:
                check_env(name, d)
            merged = chart.merge_values(values)
            check_invariants(name, merged, docs)
            check_roles(name, merged, docs)
            check_alerts(name, docs, tmp)
            out = tmp / "manifests" / name
            out.mkdir(parents=True)
            for i, (path, d) in enumerate(docs):
                (out / f"{i:02}-{d['kind']}.yaml").write_text(yaml.safe_dump(d))
            if name == "embedded":
                if os.environ.get("DENORM_TEST_BROKERS"):
                    boot(name, docs, os.environ["DENORM_TEST_BROKERS"], tmp)
                else:
                    print(f"{name}: not booted: DENORM_TEST_BROKERS is not set (scripts/test.sh sets it)")
            print(f"{name}: lint OK; {len(docs)} objects valid on Kubernetes {' and '.join(KUBE_VERSIONS)}: {', '.join(kinds)}")
        for values, needle in MUST_FAIL:
            try:
                render(chart, values)
                fail(f"values {values} rendered; expected a refusal mentioning {needle!r}")
            except helm.HelmError as e:
                if needle not in str(e):
                    fail(f"values {values} were refused, but not for {needle!r}: {e}")
        print(f"refused as expected: {len(MUST_FAIL)} invalid values sets")
        run_checkov(tmp / "manifests")
    if failed:
        print(f"\n{len(failed)} chart check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("chart checks passed")


main()
