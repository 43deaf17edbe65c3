#!/usr/bin/python3
"""Abuse tests: hostile HTTP/2 clients against kvd (test/kvd-test, ASan build
with kvd.test.Test/Stats, which reports kvd's own allocation count).  Each
attack must end in a bounded, documented reaction; kvd's memory must stay
bounded during it and return afterwards; a normal client is served after.
Last line: "N passed, N failed".
"""
import os
import socket
import struct
import sys
import time

import grpc

from kvdtest import (Kvd, H2, check, test, run_tests, frame, settings, goaways, rsts, count,
                     decode_headers, grpc_frame, wait_for, ROOT, DATA, HEADERS, PING, SETTINGS,
                     RST_STREAM, CONTINUATION, WINDOW_UPDATE)

KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
HEALTH = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
K = None


def stats():
    ch = grpc.insecure_channel(K.endpoint())
    try:
        out = ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=5).decode()
    finally:
        ch.close()
    return dict(kv.split("=") for kv in out.split())


def mem():
    return int(stats()["mem"])


def served():
    ch = grpc.insecure_channel(K.endpoint())
    try:
        return ch.unary_unary(HEALTH)(b"", timeout=5) == b"\x08\x01"
    except grpc.RpcError:
        return False
    finally:
        ch.close()


BASE = [0]


def after(name, limit_kib=1024):
    """kvd is alive, serves a normal client, and its memory came back."""
    check(K.alive(), "%s: kvd alive" % name)
    check(served(), "%s: a normal client is served" % name)
    settled = wait_for(lambda: mem() <= BASE[0] + limit_kib * 1024 // 8, 8)
    check(settled, "%s: memory back to baseline (%d -> %d bytes)" % (name, BASE[0], mem()))


@test
def baseline():
    BASE[0] = mem()
    check(BASE[0] < 64 * 1024, "baseline accounting %d bytes" % BASE[0])


@test
def ping_flood():
    c = H2(K.port)
    c.send(b"".join(frame(PING, 0, 0, struct.pack(">Q", i)) for i in range(1000)))
    fs = c.frames(2.0)
    g = goaways(fs)
    check(g and g[0][1] == "ENHANCE_YOUR_CALM" and g[0][2] == b"too_many_pings", "GOAWAY too_many_pings: %r" % g)
    check(count(fs, PING, 1) == 4, "4 PING ACKs, as etcd: %d" % count(fs, PING, 1))
    check(c.closed, "connection closed")
    after("ping-flood")


@test
def settings_flood_without_reading():
    c = H2(K.port)
    peak = 0
    for _ in range(50):
        if not c.send(b"".join(settings() for _ in range(2000))):
            break
        peak = max(peak, int(stats()["mem"]))
    check(peak < BASE[0] + 1024 * 1024, "memory bounded while the peer never reads: peak %d" % peak)
    c.close()
    after("settings-flood")


@test
def rapid_reset():
    c = H2(K.port)
    batch = b""
    for i in range(2000):
        sid = 1 + 2 * i
        batch += frame(HEADERS, 4, sid, c.block(WATCH)) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
    c.send(batch)
    fs = c.frames(2.0)
    g = goaways(fs)
    check(g and g[0][1] == "ENHANCE_YOUR_CALM" and g[0][2] == b"too_many_resets", "GOAWAY too_many_resets: %r" % g)
    check(g and g[0][0] <= 2 * 210, "stopped after about 200 resets (last id %d)" % (g[0][0] if g else -1))
    after("rapid-reset")


@test
def continuation_flood():
    c = H2(K.port)
    c.send(frame(HEADERS, 0, 1, c.block()))
    junk = c.enc.encode([("x-junk", "a" * 1000)])
    for _ in range(2000):
        if not c.send(frame(CONTINUATION, 0, 1, junk)):
            break
    g = goaways(c.frames(2.0))
    check(g and g[0][1] == "ENHANCE_YOUR_CALM" and g[0][2] == b"header block too large", "capped: %r" % g)
    after("continuation-flood")


@test
def hpack_bomb():
    c = H2(K.port)
    first = c.enc.encode([(":method", "POST"), (":scheme", "http"), (":path", HEALTH), (":authority", "x"),
                          ("content-type", "application/grpc"), ("x-bomb", "b" * 4000)])
    c.send(frame(HEADERS, 5, 1, first + b"\xbe" * 12000))
    fs = c.frames(2.0, until=lambda f: count(f, HEADERS) >= 1)
    h = decode_headers(fs, 1)
    check(h and h[0].get("grpc-status") == "8" and "header list too large" in h[0].get("grpc-message", ""),
          "48 MB of decoded headers refused: %r" % h)
    # the HPACK state is still in sync: the next request on this connection works
    c.call(3)
    fs = c.frames(2.0, until=lambda f: len(decode_headers(f, 3)) >= 2)
    h = decode_headers(fs, 3)
    check(h and h[-1].get("grpc-status") == "0", "next call on the same connection: %r" % h)
    after("hpack-bomb")


@test
def header_count():
    c = H2(K.port)
    first = c.enc.encode([(":method", "POST"), (":scheme", "http"), (":path", HEALTH), (":authority", "x"),
                          ("content-type", "application/grpc"), ("a", "")])
    c.send(frame(HEADERS, 5, 1, first + b"\xbe" * 10000))
    fs = c.frames(2.0, until=lambda f: count(f, HEADERS) >= 1)
    h = decode_headers(fs, 1)
    check(h and h[0].get("grpc-status") == "8", "10k fields refused: %r" % h)
    after("header-count")


@test
def zero_window_pending_output():
    c = H2(K.port, init_window=0)
    for i in range(50):
        c.call(1 + 2 * i, "/kvd.test.Test/Fill", grpc_frame(b"100000"))
    fs = c.frames(0.5)
    check(count(fs, DATA) == 0, "no DATA into a zero window")
    check(count(fs, HEADERS) == 50, "response HEADERS sent: %d" % count(fs, HEADERS))
    m = mem()
    check(m < BASE[0] + 50 * 140000, "held output is about what was asked (buffers grow by doubling): %d" % m)
    fs += c.frames(4.0, until=lambda f: len(rsts(fs + f)) >= 50)
    check(len([1 for s, code in rsts(fs) if code == "CANCEL"]) == 50, "stalled streams reset after --stall-timeout")
    after("zero-window")


@test
def stream_limit():
    c = H2(K.port)
    for i in range(300):
        c.send(frame(HEADERS, 4, 1 + 2 * i, c.block(WATCH)))
    fs = c.frames(2.0)
    refused = [s for s, code in rsts(fs) if code == "REFUSED_STREAM"]
    check(len(refused) == 44 and min(refused) == 1 + 2 * 256, "44 of 300 refused: %d" % len(refused))
    check(stats()["streams"] == "257", "256 open (+ the Stats call): %s" % stats()["streams"])
    c.close()
    after("stream-limit")


@test
def oversized_frame():
    c = H2(K.port)
    c.send(frame(HEADERS, 4, 1, c.block()) + frame(DATA, 1, 1, b"\0" * 20000))
    g = goaways(c.frames(2.0))
    check(g and g[0][1] == "FRAME_SIZE_ERROR", "FRAME_SIZE_ERROR: %r" % g)
    after("big-frame")


@test
def empty_data_flood():
    c = H2(K.port)
    c.send(frame(HEADERS, 4, 1, c.block(WATCH)) + b"".join(frame(DATA, 0, 1) for _ in range(3000)))
    g = goaways(c.frames(2.0))
    check(g and g[0][2] == b"too_many_glitches", "empty DATA flood: %r" % g)
    after("empty-data")


@test
def made_you_reset():
    c = H2(K.port)
    batch = b""
    for i in range(3000):
        sid = 1 + 2 * i
        batch += frame(HEADERS, 4, sid, c.block(WATCH)) + frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 0))
    c.send(batch)
    fs = c.frames(3.0)
    g = goaways(fs)
    check(g and g[0][2] == b"too_many_glitches", "invalid frames forcing resets end the connection: %r" % g)
    check(len(rsts(fs)) <= 1100, "resets bounded: %d" % len(rsts(fs)))
    after("made-you-reset")


@test
def connection_flood():
    ch = grpc.insecure_channel(K.endpoint())  # opened before the flood: it holds a slot
    pre = lambda: dict(kv.split("=") for kv in ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=5).decode().split())
    pre()
    socks, refused = [], 0
    for _ in range(400):
        try:
            s = socket.create_connection(("127.0.0.1", K.port), timeout=2)
            socks.append(s)
        except OSError:
            refused += 1
    time.sleep(0.5)
    st = pre()
    check(int(st["conns"]) <= 256, "at most 256 connections: %s" % st["conns"])
    check(int(st["refused"]) >= 400 - 255, "the rest refused: %s" % st["refused"])
    for s in socks:
        s.close()
    ch.close()
    after("connection-flood")


@test
def garbage():
    for junk in (os.urandom(5000), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(3000), b"\x16\x03\x01" + os.urandom(300)):
        s = socket.create_connection(("127.0.0.1", K.port), timeout=3)
        try:
            s.sendall(junk)
            s.settimeout(3)
            while s.recv(65536):
                pass
            closed = True
        except OSError:
            closed = True
        s.close()
        check(closed, "garbage connection closed")
    after("garbage")


def main():
    global K
    K = Kvd(KVD_TEST, ["--stall-timeout", "1s", "--max-idle-time", "2s"])
    rc = run_tests(sys.argv)
    K.stop()
    log = K.logtext()
    if "ERROR: AddressSanitizer" in log or "runtime error" in log or "LeakSanitizer" in log:
        print(log[-3000:])
        print("FAIL: sanitizer report in kvd's log")
        print("0 passed, 1 failed")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
