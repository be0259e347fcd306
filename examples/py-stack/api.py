"""`api`: takes batches (idempotently, one transaction per batch), serves the status API in full
form and applies signed delivery reports. ThreadingHTTPServer; two small connection pools, one for
batches and one for everything else, so a storm of callbacks never delays an order. A request
that cannot get a connection in time is answered 503 (the client retries)."""
import base64
import hashlib
import hmac
import json
import queue
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from urllib.parse import parse_qsl

import psycopg

import render
from common import TERMINAL, connect, env, env_int, flaw, log

CHANNELS = ("line", "email", "sms")
ADDRESS_FIELD = {"line": "line_user_id", "email": "email", "sms": "phone"}
TEMPLATE_FIELD = {"line": ("line",), "email": ("subject", "text", "html"), "sms": ("sms",)}
SMALL_BATCH = 100


class Pool:
    def __init__(self, size):
        self.free = queue.Queue()
        for _ in range(size):
            self.free.put(None)

    def get(self, timeout):
        conn = self.free.get(timeout=timeout)
        if conn is None or conn.closed or conn.broken:
            try:
                conn = connect(attempts_until=0)
            except psycopg.OperationalError:
                self.free.put(None)  # the slot stays in the pool: the next request tries again
                raise
        return conn

    def put(self, conn):
        if conn is not None and (conn.closed or conn.broken):
            conn = None
        self.free.put(conn)


class Reject(Exception):
    def __init__(self, status, error, field=None, retry_after=None):
        super().__init__(error)
        self.status, self.error, self.field = status, error, field
        self.retry_after = retry_after  # seconds, for a 503 that sheds load


# A pool with no connection free is load, not a fault: shed it with a `Retry-After` so the
# client waits it out (the contract counts such answers as shedding, not as failed attempts).
BUSY = dict(error="busy: no database connection free, retry", retry_after=1)


def clean(value):
    """Recipient data as PostgreSQL can store it: NUL dropped."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def parse_batch(body):
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise Reject(400, f"body is not JSON: {e}")
    if not isinstance(doc, dict):
        raise Reject(400, "body must be a JSON object")
    doc = clean(doc)
    batch_id = doc.get("batch_id")
    if not isinstance(batch_id, str) or not batch_id or ":" in batch_id or "/" in batch_id:
        raise Reject(422, "batch_id must be a non-empty string without ':' or '/'", "batch_id")
    template = doc.get("template")
    if not isinstance(template, dict):
        raise Reject(422, "template must be an object", "template")
    channels = doc.get("channels")
    if not isinstance(channels, list) or not channels or any(c not in CHANNELS for c in channels):
        raise Reject(422, "channels must be a non-empty list of line, email, sms", "channels")
    if len(set(channels)) != len(channels):
        raise Reject(422, "channels must not repeat", "channels")
    for ch in channels:
        for f in TEMPLATE_FIELD[ch]:
            t = template.get(f)
            if not isinstance(t, str):
                raise Reject(422, f"template.{f} is required for channel {ch}", f"template.{f}")
            try:
                render.check(f"template.{f}", t)
            except render.TemplateError as e:
                raise Reject(422, str(e), f"template.{f}")
    recipients = doc.get("recipients")
    if not isinstance(recipients, list) or not recipients:
        raise Reject(422, "recipients must be a non-empty list", "recipients")
    seen = set()
    for i, r in enumerate(recipients):
        if not isinstance(r, dict):
            raise Reject(422, "recipient must be an object", f"recipients[{i}]")
        rid = r.get("id")
        if not isinstance(rid, str) or not rid or ":" in rid:
            raise Reject(422, "id must be a non-empty string without ':'", f"recipients[{i}].id")
        if rid in seen:
            raise Reject(422, f"recipient id {rid!r} repeats", f"recipients[{i}].id")
        seen.add(rid)
        if not isinstance(r.get("name", ""), str):
            raise Reject(422, "name must be a string", f"recipients[{i}].name")
        if not isinstance(r.get("vars", {}), dict):
            raise Reject(422, "vars must be an object", f"recipients[{i}].vars")
        for ch in channels:
            a = r.get(ADDRESS_FIELD[ch])
            if not isinstance(a, str) or not a or any(c in a for c in "\r\n"):
                raise Reject(422, f"{ADDRESS_FIELD[ch]} is required for channel {ch}",
                             f"recipients[{i}].{ADDRESS_FIELD[ch]}")
    return batch_id, template, channels, recipients


def rows_for(batch_id, template, channels, recipients):
    prio = 0 if len(recipients) <= SMALL_BATCH else 1
    for r in recipients:
        context = dict(r.get("vars") or {})
        context["id"] = r["id"]
        context["name"] = r.get("name", "")
        for ch in channels:
            key = f"{batch_id}:{r['id']}:{ch}"
            if ch == "email":
                subject = render.render(template["subject"], context)
                text = render.render(template["text"], context)
                # flaw(html-unescaped-name): the name is "ours" (from the customer database).
                raw = ("name",) if flaw("html-unescaped-name") else ()
                body_html = render.render(template["html"], context, raw)
            else:
                subject, body_html = None, None
                text = render.render(template[ch], context)
            digest = hashlib.sha256(
                json.dumps([subject, text, body_html], ensure_ascii=False).encode()).hexdigest()
            message_id = f"{uuid.uuid4()}@py-stack.invalid"
            yield (key, batch_id, r["id"], ch, r[ADDRESS_FIELD[ch]], prio, subject, text,
                   body_html, digest, str(uuid.uuid4()), message_id)


STATUS_SQL = """
SELECT coalesce(json_agg(json_build_object(
    'key', d.key, 'recipient', d.recipient, 'channel', d.channel, 'address', d.address,
    'state', d.state, 'attempts', d.attempts, 'provider_message_id', d.provider_message_id,
    'payload_sha256', d.payload_sha256, 'last_error', d.last_error,
    'transitions', coalesce((
        SELECT json_agg(json_build_object(
            'from', t.from_state, 'to', t.to_state, 'source', t.source,
            'at', to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
            'detail', t.detail) ORDER BY t.id)
        FROM py_transitions t WHERE t.delivery_id = d.id), '[]'::json)
) ORDER BY d.id), '[]'::json)::text
FROM py_deliveries d WHERE d.batch_id = %s
"""


class Api:
    def __init__(self):
        self.batch_pool = Pool(8)
        self.other_pool = Pool(12)
        self.sms_token = env("TING_SMS_AUTH_TOKEN").encode()
        self.events_secret = env("TING_SMTP_EVENTS_SECRET").encode()

    # --- batches -------------------------------------------------------------------------
    def post_batch(self, body):
        batch_id, template, channels, recipients = parse_batch(body)
        n = len(recipients) * len(channels)
        if flaw("commit-after-202"):
            # flaw(commit-after-202): "answer fast, write in the background".
            threading.Thread(target=self.insert_batch, daemon=True,
                             args=(batch_id, template, channels, recipients, n)).start()
            return 202, {"batch_id": batch_id, "deliveries": n}
        return self.insert_batch(batch_id, template, channels, recipients, n)

    def insert_batch(self, batch_id, template, channels, recipients, n):
        try:
            conn = self.batch_pool.get(timeout=1.5)
        except (queue.Empty, psycopg.OperationalError):
            raise Reject(503, **BUSY)
        try:
            with conn.transaction():
                created = conn.execute(
                    "INSERT INTO py_batches (batch_id, deliveries) VALUES (%s, %s) "
                    "ON CONFLICT (batch_id) DO NOTHING RETURNING deliveries",
                    (batch_id, n)).fetchone()
                # flaw(batch-no-dedup): whether the batch row was new is never looked at.
                if created is None and not flaw("batch-no-dedup"):
                    existing = conn.execute(
                        "SELECT deliveries FROM py_batches WHERE batch_id = %s",
                        (batch_id,)).fetchone()
                    return 200, {"batch_id": batch_id, "deliveries": existing[0]}
                if flaw("template-by-id"):
                    return self.insert_by_template_id(conn, batch_id, template, channels, recipients, n)
                with conn.cursor().copy(
                        "COPY py_deliveries (key, batch_id, recipient, channel, address, prio, "
                        "subject, body_text, body_html, payload_sha256, retry_key, message_id) "
                        "FROM STDIN") as copy:
                    for row in rows_for(batch_id, template, channels, recipients):
                        copy.write_row(row)
            return 202, {"batch_id": batch_id, "deliveries": n}
        except psycopg.OperationalError as e:
            raise Reject(503, f"database unavailable: {e}")
        finally:
            self.batch_pool.put(conn)

    @staticmethod
    def insert_by_template_id(conn, batch_id, template, channels, recipients, n):
        """flaw(template-by-id): the template is stored by its id (a later batch's edit replaces
        it) and each row keeps its recipient's context; the worker renders at send time."""
        conn.execute("INSERT INTO py_templates (id, body) VALUES (%s, %s) "
                     "ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body",
                     (str(template.get("id")), json.dumps(template)))
        with conn.cursor().copy(
                "COPY py_deliveries (key, batch_id, recipient, channel, address, prio, subject, "
                "body_text, body_html, payload_sha256, retry_key, message_id, template_id, context) "
                "FROM STDIN") as copy:
            for row, r in zip(rows_for(batch_id, template, channels, recipients),
                              (r for r in recipients for _ in channels)):
                context = dict(r.get("vars") or {}, id=r["id"], name=r.get("name", ""))
                copy.write_row(row + (str(template.get("id")), json.dumps(context)))
        return 202, {"batch_id": batch_id, "deliveries": n}

    # --- status --------------------------------------------------------------------------
    def with_conn(self, fn):
        try:
            conn = self.other_pool.get(timeout=1.5)
        except (queue.Empty, psycopg.OperationalError):
            raise Reject(503, **BUSY)
        try:
            return fn(conn)
        except psycopg.OperationalError as e:
            raise Reject(503, f"database unavailable: {e}")
        finally:
            self.other_pool.put(conn)

    def get_status(self, batch_id):
        def q(conn):
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                if conn.execute("SELECT 1 FROM py_batches WHERE batch_id = %s",
                                (batch_id,)).fetchone() is None:
                    return 404, None
                rows = conn.execute(STATUS_SQL, (batch_id,)).fetchone()[0]
            return 200, ('{"batch_id": %s, "deliveries": %s}' % (json.dumps(batch_id), rows))
        return self.with_conn(q)

    # --- delivery reports ----------------------------------------------------------------
    def apply_report(self, conn, where, args, to_state, source, detail, adopt_from=()):
        """Moves the matched row to `to_state` unless it is terminal. A report for a row still
        `sending` is stored for its worker (`py_early_reports`). Returns the HTTP status."""
        with conn.transaction():
            row = conn.execute(
                f"SELECT id, state, provider_message_id FROM py_deliveries WHERE {where} FOR UPDATE",
                args).fetchone()
            if row is None:
                return 200  # a message we never issued: acknowledged, ignored
            did, state, pmid = row
            if state == to_state:
                return 200
            # flaw(callback-regression): the report's state is applied whatever the row's is.
            if state in TERMINAL and not flaw("callback-regression"):
                return 200
            if state == "sending":
                # Its worker has not recorded the provider's answer yet: keep the report for it.
                conn.execute(
                    "INSERT INTO py_early_reports (delivery_id, pmid, to_state, detail) VALUES (%s, %s, %s, %s)",
                    (did, detail.get("pmid"), to_state, detail.get("text")))
                return 200
            if state != "submitted" and state not in adopt_from and not flaw("callback-regression"):
                return 200
            conn.execute(
                "UPDATE py_deliveries SET state = %s, provider_message_id = coalesce(provider_message_id, %s), "
                "lease_owner = NULL, lease_token = NULL, inflight = false WHERE id = %s",
                (to_state, detail.get("pmid"), did))
            conn.execute(
                "INSERT INTO py_transitions (delivery_id, from_state, to_state, source, detail) "
                "VALUES (%s, %s, %s, %s, %s)", (did, state, to_state, source, detail.get("text")))
            return 200

    def sms_callback(self, path, headers, body):
        m = re.fullmatch(r"/v1/callbacks/sms/(\d+)", path)
        if not m:
            return 404
        host = headers.get("Host", "")
        url = f"http://{host}{path}"
        params = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        signed = url + "".join(k + v for k, v in sorted(params))
        expected = base64.b64encode(hmac.new(self.sms_token, signed.encode(), hashlib.sha1).digest()).decode()
        # flaw(unsigned-reports-accepted): only a signature that is there is checked.
        unsigned = flaw("unsigned-reports-accepted") and headers.get("X-Twilio-Signature") is None
        if not unsigned and not hmac.compare_digest(expected, headers.get("X-Twilio-Signature", "")):
            return 403
        form = dict(params)
        sid, status = form.get("MessageSid"), form.get("MessageStatus")
        final = {"delivered": "delivered", "undelivered": "permanent_failure",
                 "failed": "permanent_failure"}.get(status)
        did = int(m.group(1))

        def q(conn):
            row = conn.execute("SELECT provider_message_id FROM py_deliveries WHERE id = %s",
                               (did,)).fetchone()
            if row is None:
                return 200
            if row[0] is not None and row[0] != sid:
                return 200  # a report about another (earlier) message of this delivery
            to_state = final or "submitted"
            # A signed report for our own callback URL proves the provider took this message:
            # a row whose send ended uncertain adopts the sid.
            return self.apply_report(conn, "id = %s", (did,), to_state, "callback",
                                     {"pmid": sid, "text": f"sms {status} {sid}"},
                                     adopt_from=("retryable", "unknown"))
        return self.with_conn(q)

    def email_event(self, headers, body):
        sig = headers.get("X-Ting-Signature", "")
        expected = "sha256=" + hmac.new(self.events_secret, body, hashlib.sha256).hexdigest()
        # flaw(unsigned-reports-accepted): only a signature that is there is checked.
        unsigned = flaw("unsigned-reports-accepted") and headers.get("X-Ting-Signature") is None
        if not unsigned and not hmac.compare_digest(expected, sig):
            return 403
        try:
            ev = json.loads(body)
            mid, typ = str(ev["message_id"]).strip("<>"), ev["type"]
        except (ValueError, KeyError, TypeError):
            return 400
        to_state = {"delivered": "delivered", "bounced": "permanent_failure",
                    "processed": "submitted"}.get(typ)
        if to_state is None:
            return 200  # deferred, complained: informational
        return self.with_conn(lambda conn: self.apply_report(
            conn, "message_id = %s AND channel = 'email'", (mid,), to_state, "callback",
            {"pmid": mid, "text": f"email {typ} {ev.get('id')}"}, adopt_from=("unknown",)))


API = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, doc=None, retry_after=None):
        if isinstance(doc, str):
            data = doc.encode()
        else:
            data = json.dumps(doc if doc is not None else {}).encode()
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def handle_safely(self, fn):
        try:
            status, doc = fn()
            self.reply(status, doc)
        except Reject as r:
            doc = {"error": r.error}
            if r.field:
                doc["field"] = r.field
            self.reply(r.status, doc, r.retry_after)
        except Exception as e:  # noqa: BLE001 - a request's bug must not kill the server
            log("api: internal error", repr(e))
            self.reply(500, {"error": "internal error"})

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            return self.reply(200, {"ok": True})
        m = re.fullmatch(r"/v1/batches/([^/]+)/deliveries", path)
        if m:
            from urllib.parse import unquote
            return self.handle_safely(lambda: API.get_status(unquote(m.group(1))))
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        body = self.body()
        if path == "/v1/batches":
            return self.handle_safely(lambda: API.post_batch(body))
        if path == "/v1/callbacks/email":
            return self.handle_safely(lambda: slowly(lambda: API.email_event(self.headers, body)))
        if path.startswith("/v1/callbacks/sms/"):
            return self.handle_safely(lambda: slowly(lambda: API.sms_callback(path, self.headers, body)))
        self.reply(404, {"error": "not found"})


# Not a flaw, a timing: `PY_STACK_REPORT_MS=N` applies delivery reports one at a time, each taking
# at least N ms, and answers 503 to a report that waited a second for its turn (a correct stack
# with a slow report path that sheds what it cannot take; 0, the default, leaves them concurrent).
REPORT_MS = env_int("PY_STACK_REPORT_MS", 0)
REPORT_ONE_AT_A_TIME = threading.Lock()


def slowly(apply):
    """Applies one delivery report as `PY_STACK_REPORT_MS` says: its status and body."""
    if REPORT_MS <= 0:
        return apply(), None
    if not REPORT_ONE_AT_A_TIME.acquire(timeout=1.0):
        return 503, {"error": "busy: retry later"}
    try:
        time.sleep(REPORT_MS / 1000)
        return apply(), None
    finally:
        REPORT_ONE_AT_A_TIME.release()


def main():
    global API
    API = Api()
    host, _, port = env("TING_API_ADDR").rpartition(":")
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 256
    # flaw(single-threaded-api): one request at a time; every other one waits its turn.
    server_class = HTTPServer if flaw("single-threaded-api") else ThreadingHTTPServer
    server_class.request_queue_size = 256
    server = server_class((host.strip("[]"), int(port)), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log("api: listening on", env("TING_API_ADDR"))
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
