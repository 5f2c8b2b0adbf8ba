"""A shop's own site, in miniature: serves index.html and mints the user token.

    TIDINGS_API=http://127.0.0.1:8080 TIDINGS_KEY=... [TIDINGS_WS=wss://…/live] python3 server.py [--port 8000]

The tenant key stays here: the browser gets only the short-lived user token that
`POST /v1/users/{user_id}/inbox/token` answers, and uses it against Tidings itself
(docs/site.md). Standard library only.
"""

import argparse
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
USER_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def mint(api, key, user_id):
    """The user token from Tidings: `{token, expires_at}`."""
    path = "/v1/users/" + urllib.parse.quote(user_id, safe="") + "/inbox/token"
    req = urllib.request.Request(api + path, data=b"", method="POST")
    req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=10) as res:
        return json.loads(res.read())


class Shop(BaseHTTPRequestHandler):
    api = ""
    ws = ""
    key = ""

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path == "/":
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                page = f.read().replace("%TIDINGS_API%", self.api).replace("%TIDINGS_WS%", self.ws)
            return self.answer(200, "text/html; charset=utf-8", page.encode())
        if url.path == "/token":
            # A real shop takes the user from its own session; the example takes ?user=.
            user = query.get("user", ["alice"])[0]
            if not USER_ID.match(user):
                return self.answer(422, "application/json", b'{"detail": "user: letters, digits and ._:@- only"}')
            try:
                token = mint(self.api, self.key, user)
            except urllib.error.HTTPError as e:
                return self.answer(502, "application/json", e.read())
            except OSError as e:
                return self.answer(502, "application/json", json.dumps({"detail": str(e)}).encode())
            return self.answer(200, "application/json", json.dumps(token).encode(), {"Cache-Control": "no-store"})
        self.answer(404, "text/plain", b"not found")

    def answer(self, status, content_type, body, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        if os.environ.get("SHOP_LOG"):
            super().log_message(*args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args()
    Shop.api = os.environ.get("TIDINGS_API", "http://127.0.0.1:8080").rstrip("/")
    Shop.key = os.environ.get("TIDINGS_KEY", "")
    # The live feed: `{api}/v1/ws` under `tidings serve` (empty here), the stack's InboxFeedUrl on AWS.
    Shop.ws = os.environ.get("TIDINGS_WS", "")
    if not Shop.key:
        raise SystemExit("TIDINGS_KEY is not set: the tenant key `tidings serve` printed")
    server = ThreadingHTTPServer((args.host, args.port), Shop)
    # The port line is read by tests (port 0 picks a free one).
    print(f"shop listening on http://{args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
