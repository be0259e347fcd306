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


# --- flaw(...) switches: mutation testing of the harness ------------------------------------------
# `PY_STACK_FLAWS=name1,name2` puts back one or more mistakes real teams make, each a small branch
# of this stack's own code path marked `flaw(name)`. Off by default; the README's "Flaws" table
# says which shipped scenario provokes each and which checker names it. Read once, here.
KNOWN_FLAWS = {
    "claim-no-lock": "claim with SELECT … LIMIT 1, then UPDATE by id: no row lock, no state re-check",
    "rescue-ignores-inflight": "the rescuer hands every expired row back as never sent, in flight or not",
    "line-key-per-attempt": "a fresh X-Line-Retry-Key on every LINE attempt",
    "email-resend-uncertain": "an e-mail whose DATA went unanswered is retried, under the hold policy too",
    "unfenced-writes": "a sender's writes name the row by id only, not by its lease token",
    "ignore-retry-after": "the backoff ignores the provider's Retry-After",
    "early-reports-unapplied": "a report that came while its row was `sending` is kept but never applied",
    "callback-regression": "delivery reports move a row whatever its state, terminal ones too",
    "unsigned-reports-accepted": "a report without a signature header is applied unchecked",
    "html-unescaped-name": "`name` is inserted into the HTML body unescaped (it is \"our own data\")",
    "subject-raw-header": "the e-mail is built by hand: the Subject is written raw, line breaks and all",
    "template-by-id": "templates are stored by id, the latest version wins, rendered at send time",
    "batch-no-dedup": "batches are inserted without the ON CONFLICT idempotency on batch_id",
    "commit-after-202": "the API answers 202 before it commits the batch",
    "sigterm-keeps-claiming": "SIGTERM only ends the process at the grace deadline; senders keep claiming",
    "rescue-at-boot-only": "expired leases are only rescued when a worker starts",
    "timeout-as-success": "an SMS create that timed out is recorded as submitted",
    "crash-on-db-error": "a sender's database error ends the worker process (\"let it crash\")",
    "prio-after-due-time": "the claim orders by due time first, priority second",
    "single-threaded-api": "the API serves one request at a time (HTTPServer, not ThreadingHTTPServer)",
}


def _flaws():
    raw = os.environ.get("PY_STACK_FLAWS", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = sorted(names - KNOWN_FLAWS.keys())
    if unknown:
        sys.exit(f"py-stack: PY_STACK_FLAWS names unknown flaw(s) {', '.join(unknown)}; "
                 f"known: {', '.join(sorted(KNOWN_FLAWS))}")
    return frozenset(names)


FLAWS = _flaws()


def flaw(name):
    """Whether the mistake `name` is switched on (a typo in the code is an error, not a no-op)."""
    if name not in KNOWN_FLAWS:
        raise KeyError(f"py-stack: flaw({name!r}) is not in KNOWN_FLAWS")
    return name in FLAWS


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
