#!/usr/bin/env bash
# The whole test suite: what README.md calls "run the tests". Needs the PostgreSQL server binaries
# (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin; no server needs to be running.
# Set DATABASE_URL to run the database tests against an existing server instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/py_stack.rs runs the Python example stack, which needs psycopg (examples/py-stack). It is
# installed into a virtual environment of its own under target/, never into the system's Python
# (which may refuse, PEP 668), and that environment's python3 is first on PATH for the tests.
venv="$PWD/target/py-venv"
if ! command -v python3 >/dev/null; then
  echo "scripts/test.sh: python3 is required (tests/py_stack.rs runs examples/py-stack):" \
       "install Python 3.11+, then re-run" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python3" ]; then
  mkdir -p target
  if ! python3 -m venv "$venv"; then
    rm -rf "$venv"
    echo "scripts/test.sh: python3 could not create a virtual environment (on Debian:" \
         "apt install python3-venv), then re-run" >&2
    exit 1
  fi
fi
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
  -r examples/py-stack/requirements.txt
export PATH="$venv/bin:$PATH"
exec cargo test --workspace --locked "$@"
