"""A fault-injecting HTTP proxy for S3 tests: it forwards every request to an S3 server and, for the
requests a rule matches, does what real networks and servers do now and then.

    python scripts/fault_proxy.py --upstream http://127.0.0.1:PORT [--port 0]

prints `listening on PORT` once ready (stdlib only; one thread per client connection, keep-alive
kept). A test switches faults on and off with the control endpoint on the same port:

    POST /__faults  {"rules": [RULE, ...]}   replaces the rules
    GET  /__faults                           {"requests": N, "applied": [count per rule]}

A RULE matches by `method` (GET, PUT, HEAD, ...; any when left out), `key` (a regular expression
searched in the unquoted path, /BUCKET/KEY), `query` (one searched in the query string:
`uploadId=` tells a multipart upload's parts and completion from its creation), `range` (true: only requests with a Range header;
false: only without), then applies its `fault` to a match at random, one in `every` on average
(every match when left out), at most `times` times (no limit when left out). At random, not to
each `every`-th match: a client whose tries each follow one other request would meet the fault at
every try, as on no real network. The draws start over from one seed whenever rules are set, so a
case's faults fall on the same requests in every run, whatever ran before it. Faults:

- `status`: answers `status` (default 500; 503 is S3's SlowDown) without forwarding, with S3's
  error `code` in the body when given (`NoSuchUpload`: an upload already completed and gone);
- `reset`: sends the headers and half the body, then resets the connection;
- `short`: a body of half the length, with a Content-Length that says so;
- `long`: 64 bytes more than the server sent, with a Content-Length that says so;
- `ignore_range`: forwards without the Range header (the whole object, 200);
- `stall`: waits `seconds` (default 30) before forwarding;
- `lost_put`: forwards the request, then closes the connection without answering;
- `wrong_etag`, `missing_etag`: replaces the ETag header with another one, or leaves it out.
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.parse

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>')
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class Faults:
    """The rules and what they did, shared by every connection."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.set([])

    def set(self, rules):
        with self.lock:
            self.rules = rules
            self.applied = [0] * len(rules)
            self.random = random.Random(9)

    def stats(self):
        with self.lock:
            return {"requests": self.requests, "applied": list(self.applied)}

    def pick(self, method, path, query, has_range):
        """The rule to apply to this request, if any (the first that matches and is due)."""
        with self.lock:
            self.requests += 1
            for i, rule in enumerate(self.rules):
                if rule.get("method") not in (None, method):
                    continue
                if "key" in rule and not re.search(rule["key"], path):
                    continue
                if "query" in rule and not re.search(rule["query"], query):
                    continue
                if rule.get("range") is not None and bool(rule["range"]) != has_range:
                    continue
                if self.random.randrange(rule.get("every", 1)) != 0:
                    continue
                if rule.get("times") is not None and self.applied[i] >= rule["times"]:
                    continue
                self.applied[i] += 1
                return rule
            return None


class Handler(socketserver.StreamRequestHandler):
    def setup(self):
        super().setup()
        self.upstream = None

    def finish(self):
        if self.upstream:
            self.upstream.close()
        try:
            super().finish()
        except (OSError, ValueError):
            pass

    def handle(self):
        try:
            while self.one_request():
                pass
        except (OSError, http.client.HTTPException):
            pass

    def read_request(self):
        line = self.rfile.readline(65537)
        if not line:
            return None
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers = []
        while True:
            h = self.rfile.readline(65537).decode("latin-1")
            if h in ("\r\n", "\n", ""):
                break
            name, value = h.split(":", 1)
            headers.append((name.strip(), value.strip()))
        lower = {n.lower(): v for n, v in headers}
        if lower.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
            headers = [(n, v) for n, v in headers if n.lower() != "transfer-encoding"]
            headers.append(("Content-Length", str(len(body))))
        else:
            body = self.rfile.read(int(lower.get("content-length", 0)))
        return method, target, headers, body

    def one_request(self):
        request = self.read_request()
        if request is None:
            return False
        method, target, headers, body = request
        if target.startswith("/__faults"):
            return self.control(method, body)
        split = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(split.path)
        has_range = any(n.lower() == "range" for n, _ in headers)
        rule = self.server.faults.pick(method, path, split.query, has_range)
        fault = rule["fault"] if rule else None
        if fault == "status":
            status = rule.get("status", 500)
            payload = SLOW_DOWN if status == 503 else b"<Error><Code>InternalError</Code></Error>"
            if "code" in rule:
                payload = f"<Error><Code>{rule['code']}</Code></Error>".encode()
            self.respond(status, [("Content-Type", "application/xml")], payload, method)
            return True
        if fault == "stall":
            time.sleep(rule.get("seconds", 30))
        if fault == "ignore_range":
            headers = [(n, v) for n, v in headers if n.lower() != "range"]
        status, reason, out_headers, payload = self.forward(method, target, headers, body)
        if fault == "lost_put":
            self.reset()
            return False
        if fault in ("wrong_etag", "missing_etag"):
            out_headers = [(n, v) for n, v in out_headers if n.lower() != "etag"]
            if fault == "wrong_etag":
                out_headers.append(("ETag", '"%s"' % os.urandom(16).hex()))
        if method != "HEAD":
            if fault == "short":
                payload = payload[: len(payload) // 2]
            elif fault == "long":
                payload = payload + os.urandom(64)
        if fault == "reset":
            head = self.head_bytes(status, reason, out_headers, len(payload))
            self.wfile.write(head + payload[: len(payload) // 2])
            self.wfile.flush()
            self.reset()
            return False
        self.respond(status, out_headers, payload, method, reason)
        return True

    def forward(self, method, target, headers, body):
        for attempt in range(2):
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(self.server.upstream_host, self.server.upstream_port,
                                                           timeout=120)
            try:
                self.upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    if name.lower() not in HOP_BY_HOP:
                        self.upstream.putheader(name, value)
                self.upstream.endheaders(body if body else None)
                response = self.upstream.getresponse()
                payload = response.read()
                out = [(n, v) for n, v in response.getheaders() if n.lower() not in HOP_BY_HOP]
                if response.will_close:
                    self.upstream.close()
                    self.upstream = None
                return response.status, response.reason, out, payload
            except (OSError, http.client.HTTPException):
                self.upstream.close()
                self.upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def head_bytes(status, reason, headers, length, method="GET"):
        lines = [f"HTTP/1.1 {status} {reason or http.client.responses.get(status, '')}"]
        lines += [f"{n}: {v}" for n, v in headers if n.lower() != "content-length"]
        if method != "HEAD" or not any(n.lower() == "content-length" for n, _ in headers):
            lines.append(f"Content-Length: {length}")
        else:
            lines += [f"{n}: {v}" for n, v in headers if n.lower() == "content-length"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def respond(self, status, headers, payload, method, reason=None):
        self.wfile.write(self.head_bytes(status, reason, headers, len(payload), method))
        if method != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def reset(self):
        """Closes the client's connection with a reset, as a dropped network does."""
        try:
            self.wfile.flush()
        except OSError:
            pass
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for f in (self.rfile, self.wfile, self.connection):
            try:
                f.close()
            except OSError:
                pass

    def control(self, method, body):
        if method == "POST":
            self.server.faults.set(json.loads(body or b"{}").get("rules", []))
        payload = json.dumps(self.server.faults.stats()).encode()
        self.respond(200, [("Content-Type", "application/json")], payload, method)
        return True


class Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port, upstream):
        super().__init__(("127.0.0.1", port), Handler)
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port or 80
        self.faults = Faults()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the S3 server, http://HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="where to listen on 127.0.0.1 (0: a free port)")
    args = parser.parse_args()
    proxy = Proxy(args.port, args.upstream)
    print(f"listening on {proxy.server_address[1]}", flush=True)
    try:
        proxy.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
