"""Shared by the three roles: the environment (parsed once, with clear errors), database
connections, timestamps. Decides nothing about deliveries."""
import os
import sys
import time

import psycopg

TERMINAL = ("delivered", "permanent_failure", "failed")


def env(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        sys.exit(f"py-stack: missing environment variable {name}")
    return value


def env_int(name, default=None):
    raw = env(name, None if default is None else str(default))
    try:
        return int(raw)
    except ValueError:
        sys.exit(f"py-stack: {name}={raw!r} is not an integer")


def env_float(name, default=None):
    raw = env(name, None if default is None else str(default))
    try:
        return float(raw)
    except ValueError:
        sys.exit(f"py-stack: {name}={raw!r} is not a number")


def connect(autocommit=True, attempts_until=None):
    """A connection to TING_DATABASE_URL, retried while the database is unreachable (until
    `attempts_until`, a monotonic deadline, when given)."""
    url = env("TING_DATABASE_URL")
    while True:
        try:
            return psycopg.connect(url, autocommit=autocommit, connect_timeout=3)
        except psycopg.OperationalError:
            if attempts_until is not None and time.monotonic() > attempts_until:
                raise
            time.sleep(0.2)


def log(*parts):
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)
