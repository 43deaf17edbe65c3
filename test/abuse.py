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
import threading
import time

import grpc

from kvdtest import (Kvd, H2, check, test, run_tests, frame, settings, goaways, rsts, count,
                     decode_headers, grpc_frame, wait_for, ROOT, DATA, HEADERS, PING, SETTINGS,
                     RST_STREAM, CONTINUATION, WINDOW_UPDATE, GOAWAY)

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
    settled = wait_for(lambda: mem() <= BASE[0] + limit_kib * 1024 // 8, 60)
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


def honest_calls(port, n):
    """n Health/Check calls from 127.0.0.1, each on a new connection: how
    many succeeded, and their latencies (connect to answer)."""
    ok, lat = 0, []
    for _ in range(n):
        t0 = time.monotonic()
        try:
            c = H2(port, timeout=5)
            c.call(1)
            fs = c.frames(5.0, until=lambda f: len(decode_headers(f, 1)) >= 2 or goaways(f))
            h = decode_headers(fs, 1)
            ok += bool(h and h[-1].get("grpc-status") == "0")
            c.close()
        except OSError:
            pass
        lat.append(time.monotonic() - t0)
    lat.sort()
    return ok, lat


def slot_attack(port, stop, keepers, loris):
    """300 connections from 127.0.0.2 that only send WINDOW_UPDATEs, and
    slowloris connections from 127.0.0.3 that dribble the preface and
    reconnect when cut."""
    for _ in range(300):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0))
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings() + frame(SETTINGS, 1, 0))
            keepers.append(s)
        except OSError:
            pass

    def keep():
        while not stop.is_set():
            for s in keepers:
                try:
                    s.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)))
                    s.setblocking(False)
                    try:
                        s.recv(65536)
                    except OSError:
                        pass
                    s.setblocking(True)
                except OSError:
                    pass
            stop.wait(0.5)

    def dribble():
        pre = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        socks = {}
        while not stop.is_set():
            for i in range(100):
                s, at = socks.get(i, (None, 0))
                try:
                    if s is None:
                        s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.3", 0))
                        at = 0
                    s.sendall(pre[at % len(pre):at % len(pre) + 1])
                    socks[i] = (s, at + 1)
                    loris[0] += 1
                except OSError:
                    if s is not None:
                        s.close()
                    socks[i] = (None, 0)
            stop.wait(0.2)
        for s, _ in socks.values():
            if s is not None:
                s.close()
    threads = [threading.Thread(target=keep, daemon=True), threading.Thread(target=dribble, daemon=True)]
    for t in threads:
        t.start()
    return threads


@test
def connection_slots_under_attack():
    """Slots cannot be held forever: pings and window updates are not
    progress, one address gets --max-connections-per-ip, and a full table
    makes room by closing its oldest idle connection.  With both attacks
    running, 100 calls from another address all succeed."""
    for args, name in (([], "per-IP limit"), (["--max-connections-per-ip", "0"], "no per-IP limit: eviction")):
        k = Kvd(KVD_TEST, args)
        stop, keepers, loris = threading.Event(), [], [0]
        threads = slot_attack(k.port, stop, keepers, loris)
        wait_for(lambda: loris[0] > 300, 60)
        ok, lat = honest_calls(k.port, 100)
        ch = grpc.insecure_channel(k.endpoint())
        st = dict(kv.split("=") for kv in ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=5).decode().split())
        ch.close()
        stop.set()
        for t in threads:
            t.join(10)
        for s in keepers:
            s.close()
        check(ok == 100, "%s: %d of 100 calls from 127.0.0.1 succeeded" % (name, ok))
        check(k.alive(), "%s: kvd alive" % name)
        if args:
            check(int(st["evicted"]) >= 100, "%s: the calls evicted idle connections: %s" % (name, st["evicted"]))
        else:
            check(int(st["refused-ip"]) >= 300 - 64, "%s: 127.0.0.2 held 64 slots: %s refused" % (name, st["refused-ip"]))
        print("    %s: 100 calls, p50 %.1f ms, p99 %.1f ms; %s accepted, %s refused per IP, %s evicted" %
              (name, lat[49] * 1000, lat[98] * 1000, st["accepted"], st["refused-ip"], st["evicted"]))
        k.stop()
        log = k.logtext()
        check("ERROR: AddressSanitizer" not in log and "runtime error" not in log, "%s: no sanitizer report" % name)


@test
def connection_flood():
    # The flood comes from 127.0.0.2, so the observer on 127.0.0.1 is never
    # refused for its address' share; --max-idle-time may close its
    # connection on a slow machine, and it simply comes back.
    ch = grpc.insecure_channel(K.endpoint())
    pre = lambda: dict(kv.split("=") for kv in ch.unary_unary("/kvd.test.Test/Stats")(
        b"", timeout=60, wait_for_ready=True).decode().split())
    b = pre()
    base = int(b["accepted"]) + int(b["refused"])
    socks, refused = [], 0
    for _ in range(400):
        try:
            s = socket.create_connection(("127.0.0.1", K.port), timeout=2, source_address=("127.0.0.2", 0))
            socks.append(s)
        except OSError:
            refused += 1
    wait_for(lambda: (lambda s: int(s["accepted"]) + int(s["refused"]) >= base + len(socks))(pre()), 60)
    st = pre()
    check(int(st["conns"]) <= 256, "at most 256 connections: %s" % st["conns"])
    check(int(st["refused"]) >= 400 - 255, "the rest refused: %s" % st["refused"])
    for s in socks:
        s.close()
    ch.close()
    after("connection-flood")


@test
def garbage():
    """Not HTTP/2, not an HTTP/1.x request, not TLS: SETTINGS, then GOAWAY
    PROTOCOL_ERROR (h2spec 3.5/2), and the connection closes; a TLS
    ClientHello gets a TLS alert."""
    for junk in (os.urandom(5000), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(3000),
                 b"\x16\x03\x01" + os.urandom(300), b"INVALID CONNECTION PREFACE\r\n\r\n",
                 b"PRI * HTTP/2.0\r\n\r\nSM\r\n\rQ"):
        s = socket.create_connection(("127.0.0.1", K.port), timeout=3)
        data, closed = b"", False
        try:
            s.sendall(junk)
            s.settimeout(3)
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
            closed = True
        except OSError:
            closed = True
        s.close()
        check(closed, "garbage connection closed")
        if junk[:2] == b"\x16\x03":  # a TLS ClientHello: a fatal handshake_failure alert until TLS exists
            check(data == b"\x15\x03\x03\x00\x02\x02\x28", "TLS alert: %r" % data[:20])
        elif junk[:24] != b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n":
            fs, at = [], 0
            while at + 9 <= len(data):
                n = int.from_bytes(data[at:at + 3], "big")
                fs.append((data[at + 3], data[at + 4], 0, data[at + 9:at + 9 + n]))
                at += 9 + n
            check([f[0] for f in fs] == [SETTINGS, GOAWAY] and goaways(fs)[0][1] == "PROTOCOL_ERROR",
                  "%r...: SETTINGS + GOAWAY PROTOCOL_ERROR: %r" % (junk[:12], data[:40]))
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
