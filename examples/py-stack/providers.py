"""Provider clients: one call per attempt, each returning an Outcome. They never touch the
database; `check_lease` is called as the very last thing before a request leaves."""
import base64
import json
import smtplib
import socket
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate

from common import env, flaw

HTTP_TIMEOUT = 10.0
SMTP_TIMEOUT = 10.0


@dataclass
class Outcome:
    kind: str  # accepted | transient | permanent | uncertain | rate_limited | lease_lost
    provider_message_id: str | None = None
    error: str | None = None
    retry_after_s: int | None = None


class LeaseLost(Exception):
    pass


def one_line(s):
    """A header value kept on one line: every line break and control character becomes a space."""
    return "".join(" " if (ord(c) < 32 or ord(c) == 127 or c in "\u0085\u2028\u2029") else c for c in s)


def retry_after(headers):
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return max(1, int(raw)) if raw is not None else None
    except ValueError:
        return None


def timed_out(e):
    """Whether a urllib failure was a timeout (flaw(timeout-as-success) only)."""
    return isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)


def http(req, check_lease):
    """Sends `req`; returns (status, headers, body) or raises OSError for a connection failure.
    Whether the request may have reached the provider is the caller's question."""
    check_lease()
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


class Line:
    def __init__(self):
        self.url = env("TING_LINE_API_BASE").rstrip("/") + "/v2/bot/message/push"
        self.token = env("TING_LINE_CHANNEL_TOKEN")

    def send(self, d, check_lease):
        body = json.dumps({"to": d["address"], "messages": [{"type": "text", "text": d["body_text"]}]})
        req = urllib.request.Request(self.url, data=body.encode(), method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
            # flaw(line-key-per-attempt): a new key per request, so a resend is a new push.
            "X-Line-Retry-Key": str(uuid.uuid4()) if flaw("line-key-per-attempt") else d["retry_key"]})
        try:
            status, headers, raw = http(req, check_lease)
        except (OSError, urllib.error.URLError) as e:
            # The retry key makes a resend safe: a repeat of an accepted push answers 409.
            return Outcome("uncertain", error=f"line: {e}")
        if status == 200 or (status == 409 and headers.get("x-line-accepted-request-id")):
            try:
                mid = json.loads(raw)["sentMessages"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                mid = None
            return Outcome("accepted", provider_message_id=mid)
        err = f"line {status}: {raw[:200].decode('utf-8', 'replace')}"
        if status == 429:
            return Outcome("rate_limited", error=err, retry_after_s=retry_after(headers))
        if status >= 500 or status == 408:
            return Outcome("transient", error=err, retry_after_s=retry_after(headers))
        return Outcome("permanent", error=err)


class Sms:
    def __init__(self, api_addr):
        sid = env("TING_SMS_ACCOUNT_SID")
        self.base = env("TING_SMS_API_BASE").rstrip("/")
        self.url = f"{self.base}/2010-04-01/Accounts/{sid}/Messages.json"
        auth = base64.b64encode(f"{sid}:{env('TING_SMS_AUTH_TOKEN')}".encode()).decode()
        self.auth = f"Basic {auth}"
        self.sender = env("TING_SMS_FROM")
        self.callback_base = f"http://{api_addr}/v1/callbacks/sms/"

    def send(self, d, check_lease):
        form = urllib.parse.urlencode({"To": d["address"], "From": self.sender, "Body": d["body_text"],
                                       "StatusCallback": f"{self.callback_base}{d['id']}"})
        req = urllib.request.Request(self.url, data=form.encode(), method="POST", headers={
            "Authorization": self.auth, "Content-Type": "application/x-www-form-urlencoded"})
        try:
            status, headers, raw = http(req, check_lease)
        except (OSError, urllib.error.URLError) as e:
            if flaw("timeout-as-success") and timed_out(e):
                # flaw(timeout-as-success): "Twilio is up; a slow answer means it went through".
                return Outcome("accepted", provider_message_id=None)
            return Outcome("uncertain", error=f"sms: {e}")
        if status in (200, 201):
            try:
                return Outcome("accepted", provider_message_id=json.loads(raw)["sid"])
            except (ValueError, KeyError, TypeError):
                return Outcome("uncertain", error="sms: accepted without a sid")
        err = f"sms {status}: {raw[:200].decode('utf-8', 'replace')}"
        if status == 429:
            return Outcome("rate_limited", error=err, retry_after_s=retry_after(headers))
        if status >= 500 or status == 408:
            return Outcome("transient", error=err, retry_after_s=retry_after(headers))
        return Outcome("permanent", error=err)

    def list_to(self, address):
        """Every message to `address` from our number: [(sid, body)]. Raises OSError on failure."""
        q = urllib.parse.urlencode({"To": address, "From": self.sender, "PageSize": 1000})
        url, found = f"{self.url}?{q}", []
        while url:
            req = urllib.request.Request(url, headers={"Authorization": self.auth})
            try:
                with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                    page = json.loads(resp.read())
            except urllib.error.HTTPError as e:
                raise OSError(f"sms list answered {e.code}") from e
            found += [(m.get("sid"), m.get("body")) for m in page.get("messages", [])]
            nxt = page.get("next_page_uri")
            url = (self.base + nxt) if nxt else None
        return found


class Email:
    """One SMTP connection per message. Everything up to the end of DATA is certain (an error
    there means not sent); a failure after the message's bytes started leaving is uncertain."""

    def __init__(self):
        host, _, port = env("TING_SMTP_ADDR").rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.sender = env("TING_EMAIL_FROM")

    def message(self, d):
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = one_line(d["address"])
        msg["Subject"] = one_line(d["subject"] or "")
        msg["Message-ID"] = f"<{d['message_id']}>"
        msg["Date"] = formatdate(d["created_at"].timestamp(), usegmt=True)
        msg.set_content(d["body_text"], charset="utf-8")
        msg.add_alternative(d["body_html"] or "", subtype="html", charset="utf-8")
        # A boundary of our own, so every attempt sends the same bytes.
        msg.set_boundary("=_py-stack_" + d["retry_key"].replace("-", ""))
        if flaw("subject-raw-header"):
            # flaw(subject-raw-header): the headers are concatenated by hand, the Subject as
            # rendered: a line break in the data ends the header and starts another.
            del msg["Subject"]
            raw = msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))
            return b"Subject: " + (d["subject"] or "").encode("utf-8") + b"\r\n" + raw
        return msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))

    def send(self, d, check_lease):
        try:
            payload = self.message(d)
        except (ValueError, TypeError) as e:
            return Outcome("permanent", error=f"email: cannot build message: {e}")
        data_started = False
        s = smtplib.SMTP(timeout=SMTP_TIMEOUT)
        try:
            code, msg = s.connect(self.host, self.port)
            if code != 220:
                return self.refused("greeting", code, msg)
            code, msg = s.ehlo("py-stack.invalid")
            if code != 250:
                return self.refused("ehlo", code, msg)
            code, msg = s.mail(self.sender)
            if code != 250:
                return self.refused("mail", code, msg)
            code, msg = s.rcpt(d["address"])
            if code not in (250, 251):
                return self.refused("rcpt", code, msg)
            code, msg = s.docmd("DATA")
            if code != 354:
                return self.refused("data", code, msg)
            check_lease()
            data_started = True
            q = smtplib._quote_periods(payload)
            if not q.endswith(b"\r\n"):
                q += b"\r\n"
            s.send(q + b".\r\n")
            code, msg = s.getreply()
            if code == 250:
                return Outcome("accepted", provider_message_id=d["message_id"])
            return self.refused("data_end", code, msg)
        except LeaseLost:
            raise
        except (OSError, smtplib.SMTPException) as e:
            if data_started:
                return Outcome("uncertain", error=f"email: no reply after DATA: {e}")
            return Outcome("transient", error=f"email: {e}")
        finally:
            try:
                s.close()
            except OSError:
                pass

    @staticmethod
    def refused(stage, code, msg):
        text = msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
        err = f"email {stage} {code}: {text}"
        return Outcome("permanent" if 500 <= code < 600 else "transient", error=err)
