#!/usr/bin/env bash
# The whole test suite: what README.md calls "run the tests". Needs the PostgreSQL server binaries
# (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin; no server needs to be running.
# Set DATABASE_URL to run the database tests against an existing server instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/py_stack.rs runs the Python example stack, which needs psycopg (examples/py-stack).
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
  echo "scripts/test.sh: python3 with pip is required (tests/py_stack.rs runs examples/py-stack):" \
       "install Python 3.11+ and pip, then re-run" >&2
  exit 1
fi
python3 -m pip install --quiet -r examples/py-stack/requirements.txt
exec cargo test --workspace --locked "$@"
