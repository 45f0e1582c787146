"""A TCP proxy that puts a network's round trip between a client and a server on 127.0.0.1, for
benchmarks of object stores at cloud latency (the kernels here have no `tc netem`).

    python scripts/latency_proxy.py --upstream HOST:PORT --rtt-ms 20 [--port 0] [--max-seconds 7200]
                                    [--log FILE] [--connection-mbs 90]
    python scripts/latency_proxy.py --self-check

prints `listening on PORT CONTROL_PORT` once ready. Each direction of each connection is a delay
line: bytes leave RTT/2 after they arrived, in order, so a request and its response cost one RTT
however large they are (the line does not limit throughput, only delays it), and a new connection
costs one RTT more before its first byte goes through (the TCP handshake). At most 8 MiB wait in
each line; a full line stops reading its side (TCP's own back-pressure does the rest).
`--connection-mbs N` also paces each direction of each connection to N MB/s, as an object store's
connections are (about 90 MB/s each on S3): throughput then comes only from several at once.

Requests are counted at the TCP level, without parsing HTTP beyond its first line: a burst of bytes
from the client that follows the server's answer (or opens the connection) is one request, its
first line's method and target tell GETs, HEADs and listings (`list-type=`) apart. That is exact
for HTTP/1.1 without pipelining (what S3 clients send); an `Expect: 100-continue` upload would
count twice. Connecting to CONTROL_PORT returns the counts so far as one JSON line and closes.
`--log FILE` writes a line per request: seconds since the start, the connection's number, the
request line and its Range header, to tell what a reader asked for and when.

The proxy listens on 127.0.0.1 only, stops on SIGINT/SIGTERM or after --max-seconds, whichever
comes first. `--self-check` measures what it adds (the ping-pong time of one small request at
20 ms; its throughput at 0 ms) against an echo server of its own and fails (exit 1) when the
round trip is shorter than 20 ms (or absurdly long) or a byte differs.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time

CHUNK = 256 << 10
LINE_BYTES = 8 << 20


class Counts:
    def __init__(self, log=None):
        self.log = log
        self.start = time.monotonic()
        self.connections = 0
        self.requests = 0
        self.by_kind = {}
        self.bytes_up = 0
        self.bytes_down = 0

    def request(self, first, connection):
        self.requests += 1
        head = first.split(b"\r\n\r\n", 1)[0].decode("latin-1", "replace").split("\r\n")
        line = head[0]
        if self.log:
            ranges = [h.split(":", 1)[1].strip() for h in head[1:] if h.lower().startswith("range:")]
            self.log.write(f"{time.monotonic() - self.start:.3f} {connection} {line} {' '.join(ranges)}\n")
            self.log.flush()
        parts = line.split(" ")
        method = parts[0] if parts and parts[0].isalpha() else "?"
        kind = "LIST" if method == "GET" and len(parts) > 1 and "list-type=" in parts[1] else method
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def json(self):
        return json.dumps({"connections": self.connections, "requests": self.requests, "by_kind": self.by_kind,
                           "bytes_up": self.bytes_up, "bytes_down": self.bytes_down})


class Turns:
    """Which side of one connection spoke last: a client burst after the server spoke is a request."""

    def __init__(self):
        self.server_spoke = True


async def delay_line(reader, writer, one_way, on_data, rate=None):
    """Copies reader to writer, each piece leaving `one_way` seconds after it arrived, and no
    faster than `rate` bytes a second when one is given."""
    queue = asyncio.Queue()
    room = asyncio.Semaphore(LINE_BYTES // CHUNK)

    async def pump_in():
        try:
            while True:
                await room.acquire()
                data = await reader.read(CHUNK)
                if not data:
                    break
                on_data(data)
                await queue.put((time.monotonic() + one_way, data))
        except (ConnectionError, OSError):
            pass
        await queue.put((time.monotonic() + one_way, None))

    async def pump_out():
        free_at = 0.0  # when the paced line has sent what it sent so far
        try:
            while True:
                due, data = await queue.get()
                if rate and data:
                    due = max(due, free_at)
                    free_at = due + len(data) / rate
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                room.release()
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    feeder = asyncio.ensure_future(pump_in())
    try:
        await pump_out()
    finally:
        feeder.cancel()


# Python 3.11's streams drop their reference to a connection's task once the client has gone,
# and a pending task without a reference is destroyed mid-await; the proxy keeps its own.
LIVE = set()


async def handle(client_reader, client_writer, upstream, rtt, counts, rate):
    counts.connections += 1
    connection = counts.connections
    server_writer = None
    LIVE.add(asyncio.current_task())
    try:
        await asyncio.sleep(rtt)  # the TCP handshake's round trip
        server_reader, server_writer = await asyncio.open_connection(*upstream)
        turns = Turns()

        def up(data):
            counts.bytes_up += len(data)
            if turns.server_spoke:
                turns.server_spoke = False
                counts.request(data, connection)

        def down(data):
            counts.bytes_down += len(data)
            turns.server_spoke = True

        await asyncio.gather(delay_line(client_reader, server_writer, rtt / 2, up, rate),
                             delay_line(server_reader, client_writer, rtt / 2, down, rate))
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass  # a connection that ends, either way, ends its proxying; nothing else to tell
    finally:
        LIVE.discard(asyncio.current_task())
        for w in (client_writer, server_writer):
            if w is not None:
                w.close()


async def control(reader, writer, counts):
    writer.write(counts.json().encode() + b"\n")
    await writer.drain()
    writer.close()


async def serve(upstream, rtt, port, max_seconds, ready, log=None, rate=None):
    counts = Counts(log)
    proxy = await asyncio.start_server(lambda r, w: handle(r, w, upstream, rtt, counts, rate), "127.0.0.1", port)
    ctl = await asyncio.start_server(lambda r, w: control(r, w, counts), "127.0.0.1", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread (the self-check)
            pass
    ready(proxy.sockets[0].getsockname()[1], ctl.sockets[0].getsockname()[1], stop, counts)
    try:
        await asyncio.wait_for(stop.wait(), max_seconds)
    except asyncio.TimeoutError:
        pass
    proxy.close()
    ctl.close()


async def self_check():
    """Echo server behind the proxy: a small request's round trip at 20 ms, throughput at 0 ms, and
    a connection paced to 32 MB/s."""

    async def echo(reader, writer):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        writer.close()

    echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    upstream = ("127.0.0.1", echo_server.sockets[0].getsockname()[1])
    failures = []

    async def through(rtt_ms, rate=None):
        got = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(serve(upstream, rtt_ms / 1000, 0, 60,
                                           lambda port, _c, stop, counts: got.set_result((port, stop, counts)),
                                           rate=rate))
        port, stop, counts = await got
        return task, port, stop, counts

    task, port, stop, counts = await through(20)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    turns = []
    for i in range(5):
        start = time.monotonic()
        writer.write(b"GET /b/k%d HTTP/1.1\r\n\r\n" % i)
        await writer.drain()
        await reader.readexactly(len(b"GET /b/k%d HTTP/1.1\r\n\r\n" % i))
        turns.append((time.monotonic() - start) * 1000)
    writer.close()
    stop.set()
    await task
    # The fastest turn: a busy machine can only make a turn slower, never faster than the delay.
    first, later = turns[0], min(turns[1:])
    print(f"latency_proxy: at 20 ms, the first request took {first:.1f} ms (handshake + turn), "
          f"later ones {later:.1f} ms (fastest); counted {counts.requests} requests, {counts.connections} connection")
    # Bounded below only: how much slower a loaded machine makes a turn is no fault of the proxy.
    # The upper bound catches a delay in the wrong unit, not a slow machine.
    if not 19 <= later <= 2000:
        failures.append(f"a request/response turn took {later:.1f} ms, not at least 20 ms")
    if not 38 <= first <= 4000:
        failures.append(f"the first turn took {first:.1f} ms, not at least 40 ms (handshake + turn)")
    if counts.requests != 5 or counts.by_kind.get("GET") != 5 or counts.connections != 1:
        failures.append(f"counted {counts.json()}, not 5 GETs on 1 connection")

    task, port, stop, counts = await through(0)
    size = 128 << 20
    payload = os.urandom(1 << 20) * (size >> 20)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()

    async def send():
        for i in range(0, size, CHUNK):
            writer.write(payload[i:i + CHUNK])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.ensure_future(send())
    back = bytearray()
    while data := await reader.read(1 << 20):
        back += data
    await sender
    elapsed = time.monotonic() - start
    writer.close()
    stop.set()
    await task
    print(f"latency_proxy: at 0 ms, {size >> 20} MiB through and back in {elapsed:.2f} s: "
          f"{size / elapsed / 1e6:.0f} MB/s each way")
    if bytes(back) != payload:
        failures.append("the bytes that came back differ from those sent")

    # Paced: 16 MB at 32 MB/s takes half a second at least, however fast the machine.
    task, port, stop, counts = await through(0, rate=32e6)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(payload[:16_000_000])
    writer.write_eof()
    paced = len(await reader.read())
    elapsed = time.monotonic() - start
    writer.close()
    stop.set()
    await task
    echo_server.close()
    print(f"latency_proxy: paced to 32 MB/s, {paced / 1e6:.0f} MB through and back in {elapsed:.2f} s")
    if paced != 16_000_000 or not 0.5 <= elapsed <= 60:
        failures.append(f"{paced} bytes paced to 32 MB/s came back in {elapsed:.2f} s, not 16 MB in 0.5 s or more")
    for failure in failures:
        print(f"latency_proxy: self-check failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", help="the server, HOST:PORT")
    parser.add_argument("--rtt-ms", type=float, default=0, help="round trip to add, in ms (at most 10,000)")
    parser.add_argument("--port", type=int, default=0, help="where to listen on 127.0.0.1 (0: a free port)")
    parser.add_argument("--max-seconds", type=float, default=7200, help="stop by itself after this long")
    parser.add_argument("--self-check", action="store_true", help="measure the proxy itself and exit")
    parser.add_argument("--log", type=argparse.FileType("w"), help="write a line per request here")
    parser.add_argument("--connection-mbs", type=float, help="pace each connection's each direction to this many MB/s")
    args = parser.parse_args()
    if args.self_check:
        return asyncio.run(self_check())
    if not args.upstream or not 0 <= args.rtt_ms <= 10000:
        parser.error("--upstream HOST:PORT is required, and --rtt-ms between 0 and 10000")
    host, _, port = args.upstream.rpartition(":")

    def ready(port, control_port, _stop, _counts):
        print(f"listening on {port} {control_port}", flush=True)

    rate = args.connection_mbs * 1e6 if args.connection_mbs else None
    asyncio.run(serve((host or "127.0.0.1", int(port)), args.rtt_ms / 1000, args.port, args.max_seconds, ready,
                      args.log, rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
