"""`worker`: a pool of sender threads, each claiming ONE delivery per transaction
(`UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1)`), a heartbeat thread renewing
the leases this process holds, and a rescuer thread handing back rows whose lease expired.

Fencing: every claim takes a fresh lease token; every later write names (id, token), so a worker
that lost its row writes nothing. Before each provider request the sender checks its *local*
deadline (monotonic time of the last renewal that covered the row + lease − a margin).

Uncertainty: `inflight` is written (fenced) before a request leaves and cleared when its answer
is recorded, so a rescued row says whether its last attempt may have reached the provider:
LINE resends under the same retry key, SMS lists the provider's messages first and adopts its
own, e-mail follows TING_EMAIL_UNKNOWN_POLICY (hold: `unknown`)."""
import signal
import threading

# First of all, before the slow imports: a SIGTERM during start-up is a drain too (it exits 0),
# not Python's default death by signal.
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())
signal.signal(signal.SIGINT, lambda *_: stopping.set())

import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import psycopg

import providers
import render
from common import connect, env, env_float, env_int, flaw, log

WORKER = env("TING_WORKER_ID")
LEASE_MS = env_int("TING_LEASE_MS")
HEARTBEAT_MS = env_int("TING_HEARTBEAT_MS")
MAX_ATTEMPTS = env_int("TING_MAX_ATTEMPTS")
BASE_MS = env_int("TING_BACKOFF_BASE_MS")
FACTOR = env_float("TING_BACKOFF_FACTOR")
MAX_MS = env_int("TING_BACKOFF_MAX_MS")
JITTER = env_float("TING_BACKOFF_JITTER")
GRACE_MS = env_int("TING_SHUTDOWN_GRACE_MS")
POLICY = env("TING_EMAIL_UNKNOWN_POLICY", "hold")
THREADS = env_int("PY_STACK_THREADS", 8)
# Not a flaw, a timing: `PY_STACK_BOOT_MS=N` takes N ms to boot before it does anything, as a
# stack on a heavier runtime (a JVM) does.
BOOT_MS = env_int("PY_STACK_BOOT_MS", 0)
MARGIN_S = min(0.25, LEASE_MS / 4000)  # time a send needs to leave once the deadline is checked
# Not a flaw, a design: `PY_STACK_PROCS=N` runs the worker as a prefork pool (see `prefork`).
PROCS = env_int("PY_STACK_PROCS", 1)

if POLICY not in ("hold", "resend"):
    raise SystemExit(f"py-stack: TING_EMAIL_UNKNOWN_POLICY={POLICY!r} is neither hold nor resend")

held_lock = threading.Lock()
held = {}  # delivery id -> [token, local deadline (monotonic)]

COLUMNS = ("id", "from_state", "channel", "address", "subject", "body_text", "body_html",
           "retry_key", "message_id", "created_at", "attempts", "inflight", "token")

# Not a flaw, a design: `PY_STACK_CHANNEL_ORDER=email,line,sms` drains the channels one after
# another in that order (after priority): each channel's due rows are claimed before any of the
# next one's, as a stack with a queue per channel and strict priorities between them would.
CHANNEL_ORDER = [c.strip() for c in env("PY_STACK_CHANNEL_ORDER", "").split(",") if c.strip()]
if any(c not in ("line", "email", "sms") for c in CHANNEL_ORDER):
    raise SystemExit(f"py-stack: PY_STACK_CHANNEL_ORDER={','.join(CHANNEL_ORDER)!r} names a "
                     "channel other than line, email and sms")
BY_CHANNEL = (f"array_position(ARRAY[{', '.join(repr(c) for c in CHANNEL_ORDER)}]::text[], "
              "channel), " if CHANNEL_ORDER else "")

# Not a flaw, a design: `PY_STACK_WORKER_CHANNELS=1=sms;2=line;3=email` keeps each listed worker
# slot (the `N` of `TING_WORKER_ID` `wN` or `wN-rK`) to one channel, as a stack with a worker
# pool per channel would; a slot not listed claims every channel.
def own_channel():
    slot = WORKER[1:].split("-")[0]
    for part in filter(None, env("PY_STACK_WORKER_CHANNELS", "").split(";")):
        key, _, channel = part.partition("=")
        if channel.strip() not in ("line", "email", "sms") or not key.strip().isdigit():
            raise SystemExit(f"py-stack: PY_STACK_WORKER_CHANNELS part {part!r} is not "
                             "SLOT=line|email|sms")
        if key.strip() == slot:
            return channel.strip()
    return None


OWN_CHANNEL = own_channel()
ONLY_CHANNEL = f"AND channel = '{OWN_CHANNEL}'" if OWN_CHANNEL else ""

# flaw(prio-after-due-time): the priority only breaks ties between rows due at the same instant.
CLAIM_ORDER = (f"next_at, prio, {BY_CHANNEL}id" if flaw("prio-after-due-time")
               else f"prio, {BY_CHANNEL}next_at, id")

CLAIM = f"""
WITH c AS (
    SELECT id, state FROM py_deliveries
    WHERE state IN ('pending', 'retryable') AND next_at <= now() {ONLY_CHANNEL}
    ORDER BY {CLAIM_ORDER}
    FOR UPDATE SKIP LOCKED LIMIT 1
)
UPDATE py_deliveries d
SET state = 'sending', attempts = d.attempts + 1, lease_owner = %(w)s,
    lease_token = nextval('py_lease_token'), lease_until = now() + %(lease)s * interval '1 ms'
FROM c WHERE d.id = c.id
RETURNING d.id, c.state, d.channel, d.address, d.subject, d.body_text, d.body_html,
          d.retry_key::text, d.message_id, d.created_at, d.attempts, d.inflight, d.lease_token
"""

# flaw(claim-no-lock): pick a due row without locking it, then take it by id. Two threads that
# pick the same row both "claim" it (the UPDATE re-checks nothing) and both send it.
CLAIM_PICK = f"""
SELECT id, state FROM py_deliveries
WHERE state IN ('pending', 'retryable') AND next_at <= now() {ONLY_CHANNEL}
ORDER BY {CLAIM_ORDER} LIMIT 1
"""
CLAIM_TAKE = """
UPDATE py_deliveries d
SET state = 'sending', attempts = d.attempts + 1, lease_owner = %(w)s,
    lease_token = nextval('py_lease_token'), lease_until = now() + %(lease)s * interval '1 ms'
WHERE d.id = %(id)s
RETURNING d.id, %(from)s::text, d.channel, d.address, d.subject, d.body_text, d.body_html,
          d.retry_key::text, d.message_id, d.created_at, d.attempts, d.inflight, d.lease_token
"""


def backoff_s(attempts, retry_after_s):
    gap = min(MAX_MS, BASE_MS * FACTOR ** max(0, attempts - 1)) / 1000
    gap *= 1 + random.uniform(-JITTER, JITTER)
    if flaw("ignore-retry-after"):
        return gap  # flaw(ignore-retry-after): our own schedule, whatever the provider asked
    if retry_after_s is not None and retry_after_s > gap:
        gap = float(retry_after_s)
    return gap


def apply_early_reports(conn, did, channel, message_id, state, pmid):
    """Delivery reports kept while the row was `sending` (py_early_reports), applied in the
    transaction that moves it out of `sending`. A signed report proves the provider took the
    message: for e-mail it must name our Message-ID; for SMS the sid we recorded, or, when the
    answer was lost (pmid None), any sid reported to this delivery's own callback URL."""
    if channel == "email":
        pmid = message_id
    if channel == "line":
        return state
    if flaw("early-reports-unapplied"):
        return state  # flaw(early-reports-unapplied): kept by the API, never looked at again
    rows = conn.execute(
        "SELECT pmid, to_state, detail FROM py_early_reports WHERE delivery_id = %s"
        + ("" if pmid is None else " AND pmid = %s") + " ORDER BY id",
        (did,) if pmid is None else (did, pmid)).fetchall()
    if not rows:
        return state
    final = [r for r in rows if r[1] in ("delivered", "permanent_failure")]
    sid, to, detail = (final or rows)[0]
    if to == state or (to == "submitted" and state == "submitted"):
        return state
    conn.execute("UPDATE py_deliveries SET state = %s, provider_message_id = %s, inflight = false "
                 "WHERE id = %s", (to, sid, did))
    transition(conn, did, state, to, "callback", detail)
    return to


def transition(conn, did, frm, to, source, detail):
    conn.execute("INSERT INTO py_transitions (delivery_id, from_state, to_state, source, detail) "
                 "VALUES (%s, %s, %s, %s, %s)", (did, frm, to, source, detail))


class Sender(threading.Thread):
    def __init__(self, n, clients):
        super().__init__(name=f"sender-{n}", daemon=True)
        self.clients = clients
        self.conn = None

    def db(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = connect()
        return self.conn

    def run(self):
        idle = 0.02
        # flaw(sigterm-keeps-claiming): the loop never looks at `stopping`; main ends the process
        # at the grace deadline, whatever is in flight.
        while flaw("sigterm-keeps-claiming") or not stopping.is_set():
            try:
                d = self.claim()
            except psycopg.Error as e:
                log(WORKER, "claim failed:", e)
                if flaw("crash-on-db-error"):
                    crash(e)
                self.conn = None
                stopping.wait(0.3)
                continue
            if d is None:
                stopping.wait(idle)
                idle = min(0.2, idle * 2)
                continue
            idle = 0.02
            try:
                self.deliver(d)
            finally:
                with held_lock:
                    held.pop(d["id"], None)

    def claim(self):
        conn = self.db()
        if flaw("claim-no-lock"):
            return self.claim_no_lock(conn)
        with conn.transaction():
            start = time.monotonic()
            row = conn.execute(CLAIM, {"w": WORKER, "lease": LEASE_MS}).fetchone()
            if row is None:
                return None
            d = dict(zip(COLUMNS, row))
            transition(conn, d["id"], d["from_state"], "sending", "worker", WORKER)
        with held_lock:
            held[d["id"]] = [d["token"], start + LEASE_MS / 1000]
        return d

    def claim_no_lock(self, conn):
        """flaw(claim-no-lock): SELECT … LIMIT 1, then UPDATE by id, in one transaction but with
        no row lock and no re-check of the state."""
        with conn.transaction():
            start = time.monotonic()
            picked = conn.execute(CLAIM_PICK).fetchone()
            if picked is None:
                return None
            row = conn.execute(CLAIM_TAKE, {"w": WORKER, "lease": LEASE_MS, "id": picked[0],
                                            "from": picked[1]}).fetchone()
            d = dict(zip(COLUMNS, row))
            transition(conn, d["id"], d["from_state"], "sending", "worker", WORKER)
        with held_lock:
            held[d["id"]] = [d["token"], start + LEASE_MS / 1000]
        return d

    def check_lease(self, d):
        with held_lock:
            entry = held.get(d["id"])
        if entry is None or entry[0] != d["token"] or time.monotonic() > entry[1] - MARGIN_S:
            raise providers.LeaseLost()

    def fenced(self, d, sql, args, to=None, detail=None, after=None):
        """Runs one fenced update of the row (and its transition); retried while the database is
        unreachable, for as long as the lease could still be ours. Returns whether it applied."""
        deadline = time.monotonic() + max(5.0, LEASE_MS / 1000 * 3)
        while True:
            try:
                conn = self.db()
                # flaw(unfenced-writes): the row is named by its id alone, so a sender that lost
                # its lease (a frozen thread, woken) writes over whoever holds the row now.
                fence = (" WHERE id = %(id)s" if flaw("unfenced-writes") else
                         " WHERE id = %(id)s AND lease_token = %(token)s AND state = 'sending'")
                with conn.transaction():
                    cur = conn.execute(sql + fence, {**args, "id": d["id"], "token": d["token"]})
                    if cur.rowcount != 1:
                        return False
                    if to is not None:
                        transition(conn, d["id"], "sending", to, "worker", detail)
                    if after is not None:
                        after(conn)
                return True
            except psycopg.OperationalError as e:
                if flaw("crash-on-db-error"):
                    crash(e)
                self.conn = None
                if time.monotonic() > deadline:
                    log(WORKER, "giving up a write for", d["id"], e)
                    return False
                time.sleep(0.2)

    def undo_unknown(self, d):
        """The rescuer held this row `unknown` because its attempt was marked in flight, but this
        sender knows the request never left (its lease check stopped it): make it retryable.
        The rescuer keeps the lease token on an `unknown` row for exactly this."""
        try:
            conn = self.db()
            with conn.transaction():
                cur = conn.execute(
                    "UPDATE py_deliveries SET state = 'retryable', attempts = attempts - 1, inflight = false, "
                    "next_at = now(), lease_token = NULL WHERE id = %s AND lease_token = %s AND state = 'unknown'",
                    (d["id"], d["token"]))
                if cur.rowcount == 1:
                    transition(conn, d["id"], "unknown", "retryable", "worker",
                               f"{WORKER}: the held attempt never left (lease check)")
        except psycopg.OperationalError as e:
            self.conn = None
            log(WORKER, "could not undo unknown for", d["id"], e)

    def give_back(self, d, why):
        """Returns a claimed row whose attempt never left: the attempt is not counted."""
        self.fenced(d, "UPDATE py_deliveries SET state = %(st)s, attempts = attempts - 1, "
                       "lease_owner = NULL, lease_token = NULL, lease_until = NULL",
                    {"st": d["from_state"]}, to=d["from_state"], detail=f"{WORKER}: {why}")

    def deliver(self, d):
        ch = d["channel"]
        if stopping.is_set() and not flaw("sigterm-keeps-claiming"):
            return self.give_back(d, "shutting down")
        if ch == "sms" and d["inflight"]:
            if not self.reconcile_sms(d):
                return
        if d["attempts"] > MAX_ATTEMPTS:
            return self.finish(d, "failed", None, "attempts exhausted", attempts_delta=-1)
        try:
            self.check_lease(d)
        except providers.LeaseLost:
            return self.give_back(d, "lease too short to send")
        if not self.fenced(d, "UPDATE py_deliveries SET inflight = true, "
                              "first_sent_at = coalesce(first_sent_at, now())", {}):
            return
        if flaw("template-by-id"):
            self.render_now(d)
        try:
            out = self.clients[ch].send(d, lambda: self.check_lease(d))
        except providers.LeaseLost:
            # Nothing left: the provider was not asked (the check precedes the request). The row
            # goes back as it was claimed, in the same write that uncounts the attempt: left
            # `sending`, the rescuer would uncount it a second time once the lease ran out.
            if not self.fenced(d, "UPDATE py_deliveries SET state = %(st)s, inflight = %(inf)s, "
                                  "attempts = attempts - 1, lease_owner = NULL, lease_token = NULL, "
                                  "lease_until = NULL",
                               {"st": d["from_state"], "inf": d["inflight"]}, to=d["from_state"],
                               detail=f"{WORKER}: lease too short to send"):
                self.undo_unknown(d)
            return
        self.record(d, out)

    def render_now(self, d):
        """flaw(template-by-id): the message is rendered at send time from the template now
        stored under its id (edited by a later batch, if any)."""
        body, context = self.db().execute(
            "SELECT t.body, d.context FROM py_deliveries d JOIN py_templates t ON t.id = d.template_id "
            "WHERE d.id = %s", (d["id"],)).fetchone()
        d["subject"], d["body_text"], d["body_html"] = render.render_channel(body, d["channel"], context)

    def reconcile_sms(self, d):
        """The last attempt may have been accepted: look before resending. Returns whether to send."""
        try:
            self.check_lease(d)
            messages = self.clients["sms"].list_to(d["address"])
        except (OSError, providers.LeaseLost) as e:
            self.retry(d, f"sms lookup failed: {e}", None, counted=False)
            return False
        conn = self.db()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (d["address"],))
            owned = {r[0] for r in conn.execute(
                "SELECT provider_message_id FROM py_deliveries WHERE channel = 'sms' AND address = %s "
                "AND id <> %s AND provider_message_id IS NOT NULL", (d["address"], d["id"]))}
            twins = conn.execute(
                "SELECT count(*) FROM py_deliveries WHERE channel = 'sms' AND address = %s AND id <> %s "
                "AND body_text = %s AND provider_message_id IS NULL AND inflight",
                (d["address"], d["id"], d["body_text"])).fetchone()[0]
            mine = [sid for sid, body in messages if body == d["body_text"] and sid not in owned]
            ambiguous = bool(mine and twins)
            if mine and not ambiguous:
                cur = conn.execute(
                    "UPDATE py_deliveries SET state = 'submitted', provider_message_id = %s, inflight = false, "
                    "attempts = attempts - 1, lease_owner = NULL, lease_token = NULL, last_error = NULL "
                    "WHERE id = %s AND lease_token = %s AND state = 'sending'", (mine[0], d["id"], d["token"]))
                if cur.rowcount == 1:
                    transition(conn, d["id"], "sending", "submitted", "worker", f"{WORKER}: adopted {mine[0]}")
                    self.apply_early_reports(conn, d, "submitted", mine[0])
                return False
        if ambiguous:
            self.retry(d, "sms: cannot tell yet (a twin is in flight)", None, counted=False)
            return False
        if d["attempts"] > MAX_ATTEMPTS:
            self.finish(d, "failed", None, "attempts exhausted", attempts_delta=-1)
            return False
        return True

    def finish(self, d, state, pmid, error, attempts_delta=0):
        after = self.apply_early_reports if state in ("submitted", "unknown") else None
        self.fenced(d, "UPDATE py_deliveries SET state = %(st)s, provider_message_id = coalesce(%(pmid)s, provider_message_id), "
                       "last_error = %(err)s, inflight = false, attempts = attempts + %(delta)s, "
                       "lease_owner = NULL, lease_token = NULL, lease_until = NULL",
                    {"st": state, "pmid": pmid, "err": error, "delta": attempts_delta},
                    to=state, detail=WORKER, after=after and (lambda conn: after(conn, d, state, pmid)))

    @staticmethod
    def apply_early_reports(conn, d, state, pmid):
        """In the transaction that records the answer: a final report that arrived before it (for
        this message: the sid we were given, or our own Message-ID) settles the row now."""
        apply_early_reports(conn, d["id"], d["channel"], d["message_id"], state, pmid)

    def retry(self, d, error, retry_after_s, counted=True, keep_inflight=False):
        attempts = d["attempts"] if counted else d["attempts"] - 1
        if counted and attempts >= MAX_ATTEMPTS:
            return self.finish(d, "failed", None, error)
        gap = backoff_s(max(1, attempts), retry_after_s)
        self.fenced(d, "UPDATE py_deliveries SET state = 'retryable', next_at = now() + %(gap)s * interval '1 s', "
                       "last_error = %(err)s, inflight = %(inf)s, attempts = attempts + %(delta)s, "
                       "lease_owner = NULL, lease_token = NULL, lease_until = NULL",
                    {"gap": gap, "err": error, "inf": keep_inflight, "delta": 0 if counted else -1},
                    to="retryable", detail=f"{WORKER}: {error}"[:500])

    def record(self, d, out):
        ch = d["channel"]
        if out.kind == "accepted":
            return self.finish(d, "submitted" if ch != "line" else "delivered", out.provider_message_id, None)
        if out.kind == "permanent":
            return self.finish(d, "permanent_failure", None, out.error)
        if out.kind == "rate_limited":
            return self.retry(d, out.error, out.retry_after_s, counted=False)
        if out.kind == "transient":
            return self.retry(d, out.error, out.retry_after_s)
        # uncertain
        # flaw(email-resend-uncertain): SMTP "usually" failed when no 250 came: retry it.
        if ch == "email" and POLICY == "hold" and not flaw("email-resend-uncertain"):
            return self.finish(d, "unknown", None, out.error)
        return self.retry(d, out.error, None, keep_inflight=(ch == "sms"))


class Heartbeat(threading.Thread):
    """Renews the leases this process holds, only while they are still valid in the database."""

    def __init__(self):
        super().__init__(name="heartbeat", daemon=True)
        self.conn = None

    def run(self):
        while True:
            time.sleep(HEARTBEAT_MS / 1000)
            with held_lock:
                items = [(i, e[0]) for i, e in held.items()]
            if not items:
                if stopping.is_set():
                    return
                continue
            start = time.monotonic()
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.conn = connect(attempts_until=start + HEARTBEAT_MS / 1000)
                rows = self.conn.execute(
                    "UPDATE py_deliveries d SET lease_until = now() + %s * interval '1 ms' "
                    "FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token) "
                    "WHERE d.id = h.id AND d.lease_token = h.token AND d.state = 'sending' "
                    "AND d.lease_until > now() RETURNING d.id, d.lease_token",
                    (LEASE_MS, [i for i, _ in items], [t for _, t in items])).fetchall()
            except psycopg.Error as e:
                log(WORKER, "heartbeat failed:", e)
                self.conn = None
                continue
            with held_lock:
                for i, token in rows:
                    entry = held.get(i)
                    if entry is not None and entry[0] == token:
                        entry[1] = start + LEASE_MS / 1000


class Rescuer(threading.Thread):
    """Hands back rows whose lease expired (their worker died or froze), deciding from `inflight`
    whether their last attempt may have reached the provider."""

    def __init__(self):
        super().__init__(name="rescuer", daemon=True)
        self.conn = None

    def run(self):
        period = min(1.0, LEASE_MS / 2000)
        if flaw("rescue-at-boot-only"):
            # flaw(rescue-at-boot-only): "a crashed worker is restarted, and the new one cleans
            # up at boot" — once, at start; a lease that expires later is never rescued.
            time.sleep(period)
            self.conn = connect()
            return self.sweep()
        while not stopping.wait(period * random.uniform(0.8, 1.2)):
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.conn = connect(attempts_until=time.monotonic() + period)
                self.sweep()
            except psycopg.Error as e:
                log(WORKER, "rescue failed:", e)
                self.conn = None

    def sweep(self):
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT id, channel, inflight, attempts, lease_owner, message_id FROM py_deliveries "
                "WHERE state = 'sending' AND lease_until < now() FOR UPDATE SKIP LOCKED LIMIT 200").fetchall()
            for did, ch, inflight, attempts, owner, message_id in rows:
                if flaw("rescue-ignores-inflight"):
                    inflight = False  # flaw(rescue-ignores-inflight): "its worker died: send it again"
                if not inflight:
                    to, delta = "retryable", -1  # that attempt never left
                elif ch == "email" and POLICY == "hold" and not flaw("email-resend-uncertain"):
                    to, delta = "unknown", 0
                elif ch == "line" and attempts >= MAX_ATTEMPTS:
                    to, delta = "unknown", 0  # a resend could be one attempt too many
                else:
                    to, delta = "retryable", 0  # LINE: same retry key; SMS: looked up first
                self.conn.execute(
                    "UPDATE py_deliveries SET state = %s, attempts = attempts + %s, next_at = now(), "
                    "lease_owner = NULL, lease_until = NULL, "
                    "lease_token = CASE WHEN %s = 'unknown' THEN lease_token END, "
                    "inflight = CASE WHEN %s = 'unknown' OR %s THEN false ELSE inflight END WHERE id = %s",
                    (to, delta, to, to, not inflight, did))
                transition(self.conn, did, "sending", to, "rescuer", f"{WORKER}: lease of {owner} expired")
                if inflight:
                    apply_early_reports(self.conn, did, ch, message_id, to, None)


def crash(e):
    """flaw(crash-on-db-error): "let it crash, the orchestrator restarts us"."""
    log(WORKER, "database error, exiting:", e)
    sys.stderr.flush()
    os._exit(1)


def prefork():
    """`PY_STACK_PROCS=N`: N child processes claim and send, as a prefork pool (Celery's default,
    Resque) does, while this process only waits for them; each child takes its leases as
    `<worker id>.pK`. The harness signals the whole process group, so every child drains on SIGTERM
    itself (forwarded as well, should only this process get it) and dies with a SIGKILL. Returns in
    each child; the parent exits once they all have, 0 only if each did."""
    global WORKER
    children = []
    for k in range(1, PROCS + 1):
        pid = os.fork()
        if pid == 0:
            WORKER = f"{WORKER}.p{k}"
            random.seed()
            return
        children.append(pid)
    log(WORKER, f"prefork pool: children {children}")
    failed, forwarded = False, False
    while children:
        if stopping.is_set() and not forwarded:
            for child in children:
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            forwarded = True
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        children.remove(pid)
        failed |= status != 0
    log(WORKER, "prefork pool: every child exited")
    sys.stderr.flush()
    os._exit(1 if failed else 0)


def main():
    if stopping.wait(BOOT_MS / 1000):
        os._exit(0)
    if PROCS > 1:
        prefork()
    api_addr = env("TING_API_ADDR")
    clients = {"line": providers.Line(), "sms": providers.Sms(api_addr), "email": providers.Email()}
    senders = [Sender(n, clients) for n in range(THREADS)]
    for t in senders + [Heartbeat(), Rescuer()]:
        t.start()
    log(WORKER, f"started: {THREADS} senders, lease {LEASE_MS} ms")
    while not stopping.wait(0.5):
        pass
    deadline = time.monotonic() + GRACE_MS / 1000 * 0.8
    for t in senders:
        t.join(max(0.0, deadline - time.monotonic()))
    log(WORKER, "drained, exiting")
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
