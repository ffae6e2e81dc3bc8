#!/usr/bin/env bash
# Install noida-db, an independent Elasticsearch-API server written by other
# people (PyPI; it reports version 8.15.3), once per machine, cached outside
# the repository (default: $HOME/.cache/denorm/noida-db-<version>). Prints
# the path of the server binary shipped inside the wheel: the suite runs it
# directly, so one process id stops it (the package's Python wrapper would
# start it as a child).
set -euo pipefail
NOIDA_VERSION="${NOIDA_VERSION:-0.2.3}"
ROOT="${DENORM_NOIDA_ROOT:-$HOME/.cache/denorm/noida-db-$NOIDA_VERSION}"
stamp="$ROOT/.installed"
if [ ! -e "$stamp" ]; then
  echo "installing noida-db $NOIDA_VERSION into $ROOT" >&2
  rm -rf "$ROOT"
  python3 -m venv "$ROOT" >&2
  "$ROOT/bin/pip" install -q --disable-pip-version-check "noida-db==$NOIDA_VERSION" >&2
  touch "$stamp"
fi
BIN="$("$ROOT/bin/python" -c 'from importlib.resources import files; print(files("noida_db").joinpath("noida-db"))')"
chmod 755 "$BIN"
echo "$BIN"
