"""A TEST STAND-IN for the Grafana image (NOT Grafana): Grafana has no Debian package and no
registry is reachable here, so the e2e tests route this through the front door instead.

It proves what the front door and the compose file give Grafana, nothing of Grafana itself:
it serves only under the sub-path of GF_SERVER_ROOT_URL, answers only requests carrying the
auth-proxy header named by GF_AUTH_PROXY_HEADER_NAME (401 otherwise, as kit's setup never lets
one through without it), and only from an address in GF_AUTH_PROXY_WHITELIST when that is set
(Grafana's `[auth.proxy] whitelist`: comma-separated addresses or networks; a request with the
header from elsewhere is not signed in, 401 here), says whether an Authorization header reached
it, and lists the dashboards and data sources found in the mounted provisioning folders. For
each data source it asks Prometheus `up` as Grafana's proxy would: its url, with Basic auth
when `basicAuth` is set (user `basicAuthUser`, password `secureJsonData.basicAuthPassword`
with `${VAR}` expanded from the environment, as Grafana expands provisioning files), and
reports the HTTP status Prometheus answered.
"""

import base64
import ipaddress
import json
import os
import re
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

PROVISIONING = Path("/etc/grafana/provisioning")
NAME = "kit test stand-in for grafana/grafana (NOT Grafana)"
PREFIX = urlsplit(os.environ.get("GF_SERVER_ROOT_URL", "http://localhost/")).path
USER_HEADER = os.environ.get("GF_AUTH_PROXY_HEADER_NAME", "X-WEBAUTH-USER")
WHITELIST = [ipaddress.ip_network(entry.strip(), strict=False)
             for entry in os.environ.get("GF_AUTH_PROXY_WHITELIST", "").split(",")
             if entry.strip()]


def trusted(address: str) -> bool:
    """Whether the auth proxy takes the user header from this client address."""
    return not WHITELIST or any(ipaddress.ip_address(address) in net for net in WHITELIST)


def provisioned() -> dict:
    """Data-source names and dashboard titles from the mounted provisioning (no YAML parser in
    the image: the few keys are read by pattern)."""
    sources = []
    answers = {}
    for path in sorted((PROVISIONING / "datasources").glob("*.yml")):
        text = path.read_text()
        names = re.findall(r"^\s*-?\s*name: (.+)$", text, re.MULTILINE)
        sources += names
        if len(names) == 1:  # kit provisions one; its keys are then unambiguous
            answers[names[0]] = datasource_answer(text)
    boards = []
    for path in sorted((PROVISIONING / "dashboards").glob("*.yml")):
        for folder in re.findall(r"^\s*path: (.+)$", path.read_text(), re.MULTILINE):
            for board in sorted(Path(folder.strip()).glob("*.json")):
                data = json.loads(board.read_text())
                boards.append({"uid": data["uid"], "title": data["title"],
                               "panels": len(data.get("panels", []))})
    return {"datasources": sources, "datasource_answers": answers, "dashboards": boards}


def key(text: str, name: str) -> str | None:
    found = re.search(rf"^\s*{name}: (.+)$", text, re.MULTILINE)
    return found[1].strip().strip("'\"") if found else None


def datasource_answer(text: str) -> int | str:
    """The status Prometheus answers the data source's query of `up` with."""
    request = urllib.request.Request(f"{key(text, 'url')}/api/v1/query?query=up")
    if key(text, "basicAuth") == "true":
        password = re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m[1], ""),
                          key(text, "basicAuthPassword") or "")
        token = base64.b64encode(f"{key(text, 'basicAuthUser')}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return f"no answer: {error}"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        path = urlsplit(self.path).path
        if not path.startswith(PREFIX):
            return self.answer(404, {"message": "not found (served under " + PREFIX + ")"})
        if path == PREFIX + "api/health":
            return self.answer(200, {"database": "ok", "version": NAME})
        user = self.headers.get(USER_HEADER)
        if not user:
            return self.answer(401, {"message": f"no {USER_HEADER} header"})
        if not trusted(self.client_address[0]):
            return self.answer(401, {"message": f"{USER_HEADER} from {self.client_address[0]}, "
                                                "which is not in the auth proxy's whitelist"})
        return self.answer(200, {"standin": NAME, "user": user, "path": path,
                                 "authorization_received": "Authorization" in self.headers,
                                 **provisioned()})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 3000), Handler).serve_forever()
