"""What Alertmanager delivers to in the e2e tests, run in a container on the site's alerts-out
network (tests/support/alert_sinks.py starts it): a webhook receiver (HTTP POST, its path the
token the test wrote in the URL file) and an SMTP sink (aiosmtpd, AUTH LOGIN without TLS
against the password the test wrote in the password file: Go's PLAIN refuses a connection
without TLS to any host but localhost, so the sink offers LOGIN, which Alertmanager speaks).
Each delivery is one JSON line on stdout and in OUT: {kind, at (epoch seconds it arrived),
path / auth / body}.

    python3 alert_sink_server.py OUT WEBHOOK_PORT SMTP_PORT SMTP_USER SMTP_PASSWORD_FILE
"""

import asyncio
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

LOCK = threading.Lock()
# The LOGIN prompts real servers send (Postfix, Exchange: draft-murchison-sasl-login), which
# Alertmanager's LOGIN client expects; aiosmtpd's own are "User Name\0" and "Password\0".
SMTP.AuthLoginUsernameChallenge = "Username:"
SMTP.AuthLoginPasswordChallenge = "Password:"


def record(out: str, entry: dict) -> None:
    line = json.dumps({**entry, "at": time.time()}) + "\n"
    with LOCK, open(out, "a") as file:
        file.write(line)
    sys.stdout.write(line)
    sys.stdout.flush()


class Webhook(BaseHTTPRequestHandler):
    out = ""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        record(self.out, {"kind": "webhook", "path": self.path, "body": json.loads(body)})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class Mailbox:
    def __init__(self, out: str) -> None:
        self.out = out

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 (aiosmtpd's)
        record(self.out, {"kind": "smtp", "auth": bool(session.authenticated),
                          "to": envelope.rcpt_tos,
                          "body": envelope.content.decode("utf-8", "replace")})
        return "250 OK"


def authenticator(user: str, password: str):
    def check(server, session, envelope, mechanism, auth_data) -> AuthResult:
        ok = (isinstance(auth_data, LoginPassword) and auth_data.login.decode() == user
              and auth_data.password.decode() == password)
        return AuthResult(success=ok)
    return check


def main() -> None:
    out, webhook_port, smtp_port, user, password_file = sys.argv[1:6]
    with open(password_file) as file:
        password = file.read().strip()
    Webhook.out = out
    http = ThreadingHTTPServer(("0.0.0.0", int(webhook_port)), Webhook)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    controller = Controller(Mailbox(out), hostname="0.0.0.0", port=int(smtp_port),
                            authenticator=authenticator(user, password), auth_required=True,
                            auth_require_tls=False, auth_exclude_mechanism=["PLAIN"])
    controller.start()
    record(out, {"kind": "ready"})
    asyncio.run(asyncio.Event().wait())


if __name__ == "__main__":
    main()
