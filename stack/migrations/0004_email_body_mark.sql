-- E-mail's uncertain window is the message body and its final dot, not the whole SMTP session.
-- Before an e-mail's body goes out (after MAIL, RCPT and DATA were answered, so nothing has been
-- committed yet) the worker records, fenced on its lease, the lease token it is sending under.
-- A rescuer that finds an expired e-mail attempt without this mark knows no body was sent: a
-- plain retry. With it, the outcome is unknown (held, or resolved by a delivery event).
ALTER TABLE deliveries ADD COLUMN body_lease_token bigint;
