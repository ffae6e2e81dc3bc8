#!/usr/bin/env bash
# Installs the independent Avro and Kafka implementations the interop tests
# produce and decode with, once per machine, cached outside the repository
# (default: $HOME/.cache/denorm/interop):
#   - Python: fastavro + aiokafka (PyPI) in a virtualenv, with cramjam
#     (aiokafka's zstd, lz4 and snappy codecs), confluent-kafka
#     (librdkafka's own Python client, for the SCRAM users of the transport
#     tests) and jsonschema (the model file's JSON Schema checked);
#   - JavaScript: avsc + kafkajs (npm), for the machine's Node.js, with
#     smol-toml (a model file's ordering keys, for its producer);
#   - Java: Apache Avro's reference implementation (Debian's libavro-java),
#     compiled against with the machine's javac.
# Prints the cache directory. tests/it/interop.rs reads it from
# DENORM_INTEROP (scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${DENORM_INTEROP:-$HOME/.cache/denorm/interop}"
FASTAVRO=1.13.1 AIOKAFKA=0.14.0 CRAMJAM=2.14.0 CONFLUENT_KAFKA=2.16.1 JSONSCHEMA=4.23.0 AVSC=5.7.9 KAFKAJS=2.2.4 SMOL_TOML=1.9.1
mkdir -p "$ROOT"

stamp="$ROOT/py/.fastavro-$FASTAVRO-aiokafka-$AIOKAFKA-cramjam-$CRAMJAM-confluent-kafka-$CONFLUENT_KAFKA-jsonschema-$JSONSCHEMA"
if [ ! -e "$stamp" ]; then
  echo "installing fastavro $FASTAVRO, aiokafka $AIOKAFKA, cramjam $CRAMJAM, confluent-kafka $CONFLUENT_KAFKA and jsonschema $JSONSCHEMA into $ROOT/py" >&2
  rm -rf "$ROOT/py"
  python3 -m venv "$ROOT/py"
  "$ROOT/py/bin/pip" install -q --disable-pip-version-check "fastavro==$FASTAVRO" "aiokafka==$AIOKAFKA" "cramjam==$CRAMJAM" "confluent-kafka==$CONFLUENT_KAFKA" "jsonschema==$JSONSCHEMA" >&2
  touch "$stamp"
fi

stamp="$ROOT/node/.avsc-$AVSC-kafkajs-$KAFKAJS-smol-toml-$SMOL_TOML"
if [ ! -e "$stamp" ]; then
  echo "installing avsc $AVSC, kafkajs $KAFKAJS and smol-toml $SMOL_TOML into $ROOT/node" >&2
  rm -rf "$ROOT/node"
  mkdir -p "$ROOT/node"
  (cd "$ROOT/node" && echo '{"private":true}' > package.json \
    && npm install --silent --no-audit --no-fund "avsc@$AVSC" "kafkajs@$KAFKAJS" "smol-toml@$SMOL_TOML" >&2 2>/dev/null)
  touch "$stamp"
fi

if [ ! -e /usr/share/java/avro.jar ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Apache Avro for Java (Debian package libavro-java)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libavro-java >/dev/null) >&2
  else
    echo "install Debian's libavro-java for the Java interop test (needs root)" >&2
    exit 1
  fi
fi
command -v javac >/dev/null || { echo "javac is needed for the Java interop test" >&2; exit 1; }
echo "$ROOT"
