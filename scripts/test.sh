#!/usr/bin/env bash
# The whole test suite: what README.md calls "run the tests". Needs the PostgreSQL server binaries
# (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin; no server needs to be running.
# Set DATABASE_URL to run the database tests against an existing server instead.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --locked "$@"
