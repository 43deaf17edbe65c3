#!/usr/bin/python3
"""The JSON gateway (POST /v3/...), kvd beside etcd 3.7.3 (grpc-gateway v2).

- requests_like_etcd: ~125 hand-picked requests (every service, camelCase and
  proto names, enums by name and number, HTTP/1.0, chunked bodies,
  100-continue, pipelining, v2's JSON 404 {"code":5} and 501 {"code":12},
  /v3beta still rewritten, /v3alpha Go's 404, TE: trailers, the routes 3.7
  adds (auth/status, maintenance/downgrade, maintenance/hashkv; hash is
  still Hash), a keepalive whose body has no request, OPTIONS) -- the answers
  compared (Date, cluster/member ids and raft term masked; JSON bodies
  without the whitespace protojson adds at random, escapes kept).  Among
  them the JSON codec's (section 7): encoding/json's words for a body that
  is not JSON, protojson's for one it refuses (a wrong value's type, a
  field or a oneof named twice, bad base64, invalid UTF-8, a lone
  surrogate, a top-level value that is not an object), what it takes that
  jsonpb did not (URL-safe or unpadded base64, "12 x" as 12, 1e2 as an
  integer, unknown enum names dropped) and its HTML-unsafe unary output.
- a_bad_watch_body_stays_open: a watch body that is not a request gets no
  answer on either (v2's send loop just stops; 3.4 answered 500).
- random_like_etcd: diff.py's seeded random KV requests, sent as JSON (proto
  or camel names at random), answers compared byte for byte.
- streams_like_etcd: /v3/watch (history, live events, a second create on the
  same body, cancel) and /v3/lease/keepalive as chunked {"result":...} lines.
- auth_like_etcd: users and roles through the gateway, Authenticate, the
  token in Authorization, 401 (with WWW-Authenticate)/403/400 answers (v2
  maps FailedPrecondition to 400, v1 to 412), a stream refused.
- cors_like_etcd: --cors with a list: the allowed origin echoed, others not.
- limits (kvd alone): a body over the limit (413), a chunk size past it, a
  bad chunk line, a body that stops coming (closed after --max-idle-time), a
  watch that outlives it, a client gone mid-watch (its call freed), hostile
  JSON; kvd serves on.
- curl: put, get and a watch through curl itself.
Last line: "N passed, N failed".
"""
import base64
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import Client, Etcd, Kvd, check, main_guard, pb, test, wait_for

R = pb()["rpc"]
KVD_TEST = os.environ.get("KVD_TEST", os.path.join(os.path.dirname(os.path.abspath(__file__)), "kvd-test"))


def b64(s):
    return base64.b64encode(s if isinstance(s, bytes) else s.encode()).decode()


class Conn:
    """One HTTP/1.x connection, answers read by their framing."""

    def __init__(self, port, timeout=20):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def _more(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            self._more()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _take(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self):
        """(status line, [(name, value)]), skipping 100 Continue."""
        while True:
            while b"\r\n\r\n" not in self.buf:
                self._more()
            h, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = h.decode("latin-1").split("\r\n")
            if " 100 " not in lines[0]:
                return lines[0], [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]

    def chunk(self):
        """The next chunk of a chunked body, b"" at its end (trailers kept in .trailers)."""
        size = int(self._line().split(b";")[0], 16)
        if size == 0:
            self.trailers = []
            while True:
                line = self._line()
                if not line:
                    return b""
                self.trailers.append(line.decode())
        data = self._take(size)
        self._take(2)
        return data

    def answer(self, method_head=False):
        """One whole answer: (status, headers, body, trailers)."""
        st, hd = self.head()
        names = {n.lower(): v for n, v in hd}
        self.trailers = []
        if "content-length" in names:
            body = self._take(int(names["content-length"]))
        elif names.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                c = self.chunk()
                if not c:
                    break
                body += c
        else:
            try:
                while True:
                    self._more()
            except (EOFError, ConnectionResetError):
                pass
            body, self.buf = self.buf, b""
        return st, hd, body, self.trailers

    def close(self):
        self.s.close()


def squeeze(body):
    """JSON bytes without the whitespace between tokens: protojson puts a
    space after some commas at random (per build, on purpose), so etcd's
    unary bodies are compared as JSON; escapes inside strings are kept."""
    out, i, n, s = bytearray(), 0, len(body), False
    while i < n:
        c = body[i]
        if s:
            out.append(c)
            if c == 0x5c and i + 1 < n:  # a backslash: the next byte is escaped
                i += 1
                out.append(body[i])
            elif c == 0x22:
                s = False
        elif c == 0x22:
            s = True
            out.append(c)
        elif c not in b" \t\r\n":
            out.append(c)
        i += 1
    return bytes(out) + (b"\n" if body.endswith(b"\n") else b"")


def mask(x):
    """Date out; cluster/member ids and raft term (they differ by name and URLs)
    masked; a JSON body squeezed, its Content-Length with it."""
    if isinstance(x, tuple):
        st, hd, body, tr = x
        js = body[:1] in (b"{", b"[")
        body = squeeze(body) if js else body
        hd = [(n, str(len(body)) if js and n.lower() == "content-length" else v) for n, v in hd]
        return st, sorted(h for h in hd if h[0].lower() != "date"), mask(body), tr
    return re.sub(rb'"(cluster_id|member_id|raft_term|leader|memberID)":"\d+"', rb'"\1":"X"', x)


def post(path, body, extra=b"", ver=b"1.1"):
    if isinstance(body, str):
        body = body.encode()
    return (b"POST " + path.encode() + b" HTTP/" + ver + b"\r\nHost: x\r\nContent-Length: %d\r\n" % len(body) +
            extra + b"\r\n" + body)


def exchange(port, data, n=1):
    c = Conn(port)
    c.send(data)
    out = []
    for _ in range(n):
        try:
            out.append(mask(c.answer()))
        except (EOFError, ConnectionResetError):
            out.append("closed")
            break
    c.close()
    return out


def pair_check(e, k, data, what, n=1):
    a, b = exchange(e.port, data, n), exchange(k.port, data, n)
    check(a == b, "%s\n   etcd: %.1500r\n   kvd:  %.1500r" % (what, a, b))
    return b


@test
def requests_like_etcd():
    """Hand-picked gateway requests, good and hostile bodies, on etcd 3.7.3
    and kvd: each answer's JSON (protojson's, from the message) and each
    refusal's text (protojson's words) compared. [§7.1] [§7.2]"""
    e = Etcd()
    k = Kvd(KVD_TEST)
    cases = [
        post("/v3/kv/put", '{"key":"Zm9v","value":"YmFy"}'),
        post("/v3/kv/put", '{"key":"Zm9v","value":"Yg==","prevKv":true}'),
        post("/v3/kv/range", '{"key":"Zm9v"}'),
        post("/v3/kv/range", '{"key":""}'),
        post("/v3/kv/range", ''),
        post("/v3/kv/range", '   '),
        post("/v3/kv/range", '{"key":"Zm9v", "bogus": [1, {"x": null}]}'),
        post("/v3/kv/range", '{"key":"Zm9v"} trailing garbage is ignored'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":1.5}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":"abc"}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":"12a"}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":""}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":true}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":99999999999999999999}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":"-3"}'),
        post("/v3/kv/range", '{"key":"Zm9v","sort_order":"DESC"}'),
        post("/v3/kv/range", '{"key":"AA==","range_end":"AA==","sort_order":"DESCEND","sortTarget":"KEY"}'),
        post("/v3/kv/range", '{"key":"AA==","rangeEnd":"AA==","sort_order":1,"sort_target":4}'),
        post("/v3/kv/range", '{"key":"Zm9v","keys_only":"true"}'),
        post("/v3/kv/range", '{"key":5}'),
        post("/v3/kv/range", '{"key":"Zg="}'),
        post("/v3/kv/range", '{"key":"Zg=x"}'),
        post("/v3/kv/range", '{"key":"Zg==Zg=="}'),
        post("/v3/kv/range", '{"key":"Z"}'),
        post("/v3/kv/range", '{"key":"Zm9v-_"}'),
        post("/v3/kv/range", 'xyz'),
        post("/v3/kv/range", '5'),
        post("/v3/kv/range", '"abc"'),
        post("/v3/kv/range", '[1]'),
        post("/v3/kv/range", '{"key":"Zm9v",}'),
        post("/v3/kv/range", '{"key" "Zm9v"}'),
        post("/v3/kv/range", '{"key":"Zm9v" "x"}'),
        post("/v3/kv/range", '{"key":"Zm9v","keys_only":tru}'),
        post("/v3/kv/range", '{"key":"\\q"}'),
        post("/v3/kv/range", '{"key":"\\u12G4"}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":-}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":1.}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":1e}'),
        post("/v3/kv/range", '{"key":"Zm9v"'),
        post("/v3/kv/range", '{"key":"Zm9v", "range_end":"AA==", "rangeEnd": "Zm9w"}'),
        post("/v3/kv/range", '{"key":"Zm9v", "rangeEnd":"AA==", "range_end": "Zm9w"}'),
        post("/v3/kv/range", '{"key":"Zm9v", "key":"YQ=="}'),
        post("/v3/kv/range", '{"key":null}'),
        post("/v3/kv/range", '{"key":"Zm9v","revision":{}}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":"12 34","sort_order":"1","rangeEnd":"Zg\\n"}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":1e2,"revision":"0e99999999999","sortTarget":1.0}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":" 12"}'),
        post("/v3/kv/range", '{"key":"Zm9v","limit":null,"limit":1}'),
        post("/v3/kv/range", '{"key":"Zm9v","sort_order":true}'),
        post("/v3/kv/range", '{"key":"Zg==\\n","Key":"x"}'),
        post("/v3/kv/range", '{"[key]":"YQ==","key":"Zh=="}'),
        post("/v3/kv/range", '{"key":"\\ud800"}'),
        post("/v3/kv/range", '{"key":"\\ud800","limit":1}'),
        post("/v3/kv/range", '{"key":"\\ud800\\u0041xxxx"}'),
        post("/v3/kv/range", b'{"key":"Zm9v","bogus":"\xff"}'),
        post("/v3/kv/range", b'{"key":"Zm9v",\n "\xc3\xa9":1, "limit":"\xc3\xa9x"}'),
        post("/v3/kv/range", 'null'),
        post("/v3/kv/range", '5xyz'),
        post("/v3/kv/range", '  \n  {"key":5}'),
        post("/v3/maintenance/alarm", '{"action":"GET","memberID":"-1"}'),
        post("/v3/kv/txn", '{"success":[{"request_put":{"key":"YQ=="},"request_range":{"key":"YQ=="}}]}'),
        post("/v3/kv/txn", b'{"success":[{"request_put":{"key":"YQ=="},"requestRange":"\xff"}]}'),
        post("/v3/kv/txn", '{"compare":[{"version":"1","create_revision":"2","key":"YQ=="}]}'),
        post("/v3/kv/txn", '{"compare":[null]}'),
        post("/v3/kv/deleterange", '{"key":"AA==","range_end":"AA==","prev_kv":true}'),
        post("/v3/kv/txn", '{"compare":{}}'),
        post("/v3/kv/txn", '{"compare":[{"target":"VALUE","key":"Zm9v","value":""}],'
                           '"failure":[{"request_range":{"key":"Zm9v"}}]}'),
        post("/v3/kv/txn", '{"success":[{"request_put":{"key":"PA==","value":"Pj4mJg=="}},'
                           '{"requestRange":{"key":"PA=="}}]}'),
        post("/v3/kv/txn", '{"compare":[{"target":"CREATE","key":"Zm9v","createRevision":"0"}],'
                           '"success":[{"requestPut":{"key":"Zm9v","value":"YmFy"}}],'
                           '"failure":[{"requestDeleteRange":{"key":"Zm9v","prevKv":true}}]}'),
        post("/v3/kv/txn", '{"compare":[{"result":"NOT_EQUAL","target":"MOD","key":"YQ==","mod_revision":"0"}]}'),
        post("/v3/kv/txn", '{"compare":[{"target":"NOPE","key":"YQ=="}]}'),
        post("/v3/kv/compaction", '{"revision":"100"}'),
        post("/v3/kv/compaction", '{"revision":"2","physical":true}'),
        post("/v3/kv/range", '{"key":"Zm9v","revision":"1"}'),
        post("/v3/lease/grant", '{"TTL":60,"ID":77}'),
        post("/v3/lease/grant", '{"TTL":"60","ID":"77"}'),
        post("/v3/kv/put", '{"key":"bGVhc2Vk","value":"","lease":"77"}'),
        post("/v3/lease/timetolive", '{"ID":"123"}'),
        post("/v3/kv/lease/leases", '{}'),
        post("/v3/lease/revoke", '{"ID":"77"}'),
        post("/v3/kv/lease/revoke", '{"ID":"77"}'),
        post("/v3/maintenance/alarm", '{"action":"GET"}'),
        post("/v3/maintenance/alarm", '{"action":"DEACTIVATE","alarm":"NOSPACE"}'),
        post("/v3/auth/user/add", '{"name":"<a&b>\\u2028\xc3\xa9 \\u0001","password":"x"}'),
        post("/v3/auth/user/list", '{}'),
        post("/v3/auth/user/get", '{"name":"nobody"}'),
        post("/v3/auth/role/add", '{"name":"r"}'),
        post("/v3/auth/role/grant", '{"name":"r","perm":{"permType":"READWRITE","key":"YQ==","range_end":"Yg=="}}'),
        post("/v3/auth/role/get", '{"role":"r"}'),
        post("/v3beta/kv/range", '{"key":"Zm9v","keysOnly":true}'),
        post("/v3alpha/kv/range", '{"key":"Zm9v"}'),
        post("/v3/lease/keepalive", ''),  # v2 half-closes at once: LeaseKeepAlive ends OK, nothing sent
        post("/v3/lease/keepalive", '5'),
        post("/v3/lease/keepalive", '{"ID":'),
        post("/v3/maintenance/snapshot", '{"x":'),  # a server stream's request is read as a unary one's
        post("/v3/auth/status", '{}'),
        post("/v3/auth/authenticate", '{"name":"a","password":"b"}'),  # FailedPrecondition: v2 says 400 (v1 412)
        post("/v3/maintenance/hashkv", '{"revision":"0"}'),
        post("/v3/maintenance/downgrade", '{"action":"VALIDATE","version":"3.6"}'),
        post("/v3/maintenance/downgrade", '{"action":"VALIDATE","version":"3.5"}'),
        post("/v3/maintenance/downgrade", '{"action":"CANCEL"}'),
        post("/v3beta/maintenance/downgrade", '{"action":"VALIDATE","version":"3.6"}'),
        post("/v3/kv/range", '{"key":"Zm9v"}', extra=b"TE: trailers\r\n"),
        post("/v3/kv/range", '{}', extra=b"TE: Trailers, deflate\r\n"),
        post("/v3/kv/range", '{"key":"Zm9v"', extra=b"TE: trailers\r\n"),
        post("/v3/kv/range", '{}', extra=b"TE: trailers\r\n", ver=b"1.0"),
        post("/v3/kv/range", '{}', extra=b"TE: gzip\r\n"),
        post("/v3/nothere", '{}'),
        post("/v3/", '{}'),
        post("/v3/kv/range/", '{}'),
        post("/v3/KV/range", '{}'),
        post("/v3/kv/range", '{}', ver=b"1.0"),
        b"GET /v3/kv/range HTTP/1.1\r\nHost: x\r\n\r\n",
        b"DELETE /v3/watch HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v3/kv/nothere HTTP/1.0\r\nHost: x\r\n\r\n",
        b"POST /v3 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        post("/v3/kv/range", '{"key":"Zm9v"}', ver=b"1.0"),
        post("/v3/kv/range", '{"key":""}', ver=b"1.0"),
        post("/v3/kv/range", '{"key":"Zm9v"}', extra=b"Expect: 100-continue\r\n"),
        b"GET /v3/kv/nothere HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v3/kv/nothere HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /v3beta/kv/range HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PUT /v3/kv/range HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"OPTIONS /v3/kv/range HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\n{\"key\r\n9\r\n\":\"Zm9v\"}\r\n0\r\nX-T: 1\r\n\r\n",
        b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ]
    for i, data in enumerate(cases):
        pair_check(e, k, data, "case %d %r" % (i, data[:160]))
    nolen = lambda hd: [h for h in hd if h[0] != "Content-Length"]
    # /v3/maintenance/hash is still Hash in 3.7 (its value is bbolt's file's, not compared)
    a, b = [exchange(srv.port, post("/v3/maintenance/hash", "{}"))[0] for srv in (e, k)]
    keys = [sorted(json.loads(x[2])) if x[0].endswith("200 OK") else x for x in (a, b)]
    check(keys[0] == keys[1] == ["hash", "header"] and nolen(a[1]) == nolen(b[1]), "/v3/maintenance/hash: %r / %r" % (a, b))
    # pipelined: three requests in one write, answered in order
    data = (post("/v3/kv/range", '{"key":"Zm9v"}') + post("/v3/kv/range", '{"key":""}') +
            post("/v3/kv/put", '{"key":"cA==","value":"cQ=="}'))
    pair_check(e, k, data, "three pipelined requests", n=3)
    # the answer after a 1.4 MB value (base64 in and out)
    big = b64(b"v" * 1400000)
    pair_check(e, k, post("/v3/kv/put", '{"key":"Ymln","value":"%s"}' % big), "a 1.4 MB put")
    pair_check(e, k, post("/v3/kv/range", '{"key":"Ymln"}'), "a 1.4 MB range")
    # an alarm: Alarm's answers have no header; /health follows it
    for data in (post("/v3/maintenance/alarm", '{"action":"ACTIVATE","memberID":"1","alarm":"NOSPACE"}'),
                 post("/v3/maintenance/alarm", '{"action":"GET"}'),
                 post("/v3/kv/put", '{"key":"Zm9v","value":"YmFy"}'),
                 post("/v3/maintenance/alarm", '{"action":"DEACTIVATE","memberID":"1","alarm":"NOSPACE"}')):
        pair_check(e, k, data, "alarm %r" % data[-80:])
    check(k.alive(), "kvd serves on")
    e.stop()
    k.stop()


def to_json(req, rnd):
    from google.protobuf import json_format
    return json_format.MessageToJson(req, preserving_proto_field_name=rnd.random() < 0.5, indent=None)


GW = {"Range": "/v3/kv/range", "Put": "/v3/kv/put", "DeleteRange": "/v3/kv/deleterange", "Txn": "/v3/kv/txn",
      "Compact": "/v3/kv/compaction"}


@test
def random_like_etcd():
    """Random KV requests written as protojson writes them (either field
    naming) to etcd 3.7.3's gateway and kvd's: the answers alike. [§7.1] [§7.2]"""
    import diff
    from google.protobuf import json_format
    for seed in (11, 12):
        g = diff.Gen(seed)
        rnd = random.Random(seed)
        e = Etcd()
        k = Kvd(KVD_TEST, ["--unsafe-no-fsync"])
        ce, ck = Conn(e.port, 60), Conn(k.port, 60)
        bad = 0
        for i in range(300):
            method, req = g.next()
            data = post(GW[method], to_json(req, rnd))
            ce.send(data)
            ck.send(data)
            raw = ce.answer()
            a, b = mask(raw), mask(ck.answer())
            if a != b:
                bad += 1
                print("seed %d op %d %s: etcd %r\n  kvd %r" % (seed, i, diff.brief(method, req)[:300],
                                                             (a[0], a[1], a[2][:300]), (b[0], b[1], b[2][:300])))
                break
            if a[0].endswith("200 OK"):
                ans = getattr(R, type(req).__name__.replace("Request", "Response"))()
                json_format.Parse(raw[2], ans, ignore_unknown_fields=True)
                g.learn(method, req, ("ok", ans))
        check(bad == 0, "seed %d: 300 random requests answered alike" % seed)
        ce.close()
        ck.close()
        e.stop()
        k.stop()


def stream_lines(c, n):
    """n {"result":...} lines of a chunked stream; "END" for its last chunk,
    "EOF" for a connection closed without one."""
    out = []
    while len(out) < n:
        try:
            ch = c.chunk()
        except EOFError:
            out.append("EOF")
            break
        if not ch:
            out.append("END")
            break
        out.append(mask(ch))
    return out


@test
def streams_like_etcd():
    e = Etcd()
    k = Kvd(KVD_TEST)
    res = {}
    for name, srv in (("etcd", e), ("kvd", k)):
        c = Conn(srv.port)
        for v in ("YQ==", "Yg=="):
            c.send(post("/v3/kv/put", '{"key":"Zm9v","value":"%s"}' % v))
            c.answer()
        w = Conn(srv.port)
        # a chunked body of three JSON values, each a watch request (etcd 3.4
        # answers once the body ended: Go's HTTP/1 server is not full duplex)
        body = ('{"create_request":{"key":"Zm9v","start_revision":"1","prev_kv":true}}\n'
                '{"create_request":{"key":"YQ==","range_end":"Yg==","watch_id":"7"}}'
                '{"create_request":{"key":"eg==","watch_id":"8"}}').encode()
        w.send(b"POST /v3/watch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
               b"%x\r\n%s\r\n" % (50, body[:50]) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - 50, body[50:]))
        head = w.head()
        lines = stream_lines(w, 4)  # created x3, then the history
        c.send(post("/v3/kv/delete" + "range", '{"key":"Zm9v"}'))
        c.answer()
        lines += stream_lines(w, 1)
        c.send(post("/v3/kv/put", '{"key":"YWE=","value":"eA=="}'))
        c.answer()
        lines += stream_lines(w, 1)
        w.close()
        # keepalive: one JSON value, then the stream answers it
        c.send(post("/v3/lease/grant", '{"TTL":30,"ID":"5"}'))
        c.answer()
        ka = Conn(srv.port)
        ka.send(post("/v3/lease/keepalive", '{"ID":"5"}{"ID":"6"}'))
        kh = ka.head()
        klines = stream_lines(ka, 2)
        ka.close()
        # a server stream: the snapshot's first message
        sn = Conn(srv.port)
        sn.send(post("/v3/maintenance/snapshot", "{}"))
        sh = sn.head()
        first = json.loads(sn.chunk())
        sn.close()
        res[name] = ([h for h in head[1] if h[0] != "Date"], head[0], lines, kh[0], klines, sh[0],
                     sorted(first["result"].keys()))
        c.close()
    check(res["etcd"] == res["kvd"], "watch, keepalive and snapshot streams:\n  etcd %r\n  kvd  %r" %
          (res["etcd"], res["kvd"]))
    e.stop()
    k.stop()


@test
def a_stop_ends_streams_as_etcd():
    """SIGTERM with a /v3/watch and a /v3/election/observe open: etcd ends
    each at once with grpc-gateway's error object and the last chunk, then
    exits; kvd did the same only after its whole --shutdown-grace, during
    which Patroni (which speaks this gateway) could reach no store and
    demoted its primary.  The streams are compared byte for byte but for
    the error object, whose text is racy in etcd (see below); kvd must write
    etcd 3.7's "error reading from server: EOF" one (3.4's gateway saw
    "transport is closing") in v2's {"error":{"code","message"}} line and
    exit long before a 60 s grace."""
    e = Etcd()
    k = Kvd(KVD_TEST, ["--shutdown-grace", "60s"])
    res, took = {}, {}
    for name, srv in (("etcd", e), ("kvd", k)):
        c = Conn(srv.port)
        c.send(post("/v3/lease/grant", '{"TTL":30,"ID":"5"}'))
        c.answer()
        w, ka = Conn(srv.port), Conn(srv.port)
        w.send(post("/v3/watch", '{"create_request":{"key":"Zm9v"}}'))
        wh = w.head()
        first = stream_lines(w, 1)
        c.send(post("/v3/election/campaign", '{"name":"ZWw=","value":"djE=","lease":"5"}'))
        c.answer()
        ka.send(post("/v3/election/observe", '{"name":"ZWw="}'))  # a server stream: it stays open
        kh = ka.head()
        kfirst = stream_lines(ka, 1)
        t0 = time.time()
        srv.p.send_signal(signal.SIGTERM)
        rest, krest = stream_lines(w, 3), stream_lines(ka, 3)
        srv.p.wait(60)
        took[name] = time.time() - t0
        res[name] = (wh[0], first, rest, kh[0], kfirst, krest)
        for x in (c, w, ka):
            x.close()
    # etcd's own ending races: its gateway's client connection may see the
    # server's connection end (14 "error reading from server: EOF", what 3.7
    # says here; 3.4 said "transport is closing") or close first itself (1,
    # "grpc: the client connection is closing"), or, rarely, exit before
    # writing either, its HTTP connection closed bare ("EOF"); kvd writes
    # the first and the last chunk, always.  Everything else is compared as
    # is, the tail after the error object only where etcd wrote one.
    closing = b'{"error":{"code":14,"message":"error reading from server: EOF"}}\n'
    racing = (b'{"error":{"code":14,"message":"transport is closing"}}\n',
              b'{"error":{"code":1,"message":"grpc: the client connection is closing"}}\n', "EOF")
    tail = lambda r, i: r[i][1:] if res["etcd"][i][0] != "EOF" else None
    same = lambda r: tuple([tail(r, 2), tail(r, 5)] + [r[i] for i in (0, 1, 3, 4)])
    check(same(res["etcd"]) == same(res["kvd"]), "the streams but their errors:\n  etcd %r\n  kvd  %r" %
          (res["etcd"], res["kvd"]))
    check(all(res["etcd"][i][0] in (closing,) + racing for i in (2, 5)), "etcd ends each in one of its ways: %r" %
          ([res["etcd"][2], res["etcd"][5]],))
    check(res["kvd"][2] == [closing, "END"] and res["kvd"][5] == [closing, "END"],
          "kvd ends each with etcd's error object, then the last chunk: %r" % ([res["kvd"][2], res["kvd"][5]],))
    check(took["kvd"] < 30, "kvd exited well within its 60 s grace: %.2f s" % took["kvd"])
    print("    SIGTERM to exit with two gateway streams open: etcd %.3f s, kvd %.3f s" % (took["etcd"], took["kvd"]))


def auth_steps():
    return [
        ("/v3/auth/enable", "{}"),
        ("/v3/auth/user/add", '{"name":"root","password":"rootpw"}'),
        ("/v3/auth/role/add", '{"name":"root"}'),
        ("/v3/auth/user/grant", '{"user":"root","role":"root"}'),
        ("/v3/auth/user/add", '{"name":"u","password":"upw"}'),
        ("/v3/auth/role/add", '{"name":"ro"}'),
        ("/v3/auth/role/grant", '{"name":"ro","perm":{"permType":"READ","key":"YQ==","range_end":"Yg=="}}'),
        ("/v3/auth/user/grant", '{"user":"u","role":"ro"}'),
        ("/v3/auth/enable", "{}"),
        ("/v3/kv/range", '{"key":"YQ=="}'),
    ]


@test
def a_bad_watch_body_stays_open():
    """A /v3/watch or /v3/lease/keepalive body whose first value is not a
    request: grpc-gateway v2's send loop stops and half-closes; etcd's Watch
    then waits (no answer at all), LeaseKeepAlive ends OK (an empty 200).
    3.4's gateway answered 500 {"code":2}.  The watch's silence is checked
    after a later request on another connection was answered, and on kvd
    by its call still being open."""
    e = Etcd()
    k = Kvd(KVD_TEST)
    base = int(stats(k)["streams"])
    for body in ('5', '{"create_request":5}', '{"create_request":{"key":"Zm9v"}'):
        got = []
        for srv in (e, k):
            w = Conn(srv.port)
            w.send(post("/v3/watch", body))
            if srv is k:
                check(wait_for(lambda: int(stats(k)["streams"]) == base + 1, 30), "kvd: the watch call is open")
            after = exchange(srv.port, post("/v3/kv/range", '{"key":"Zm9v"}'))[0]
            w.s.setblocking(False)
            try:
                d = w.s.recv(100)
                got.append("closed" if d == b"" else d)
            except BlockingIOError:
                got.append("open, nothing said")
            w.close()
            got.append(after[0])
        check(got[0] == got[2] == "open, nothing said" and got[1] == got[3] == "HTTP/1.1 200 OK",
              "watch %r: etcd %r / kvd %r" % (body, got[:2], got[2:]))
        check(wait_for(lambda: int(stats(k)["streams"]) == base, 30), "kvd: the call freed with its client")
    e.stop()
    k.stop()


@test
def full_duplex():
    """kvd answers each JSON value of a stream's body as it comes (etcd 3.4
    waits for the body's end): a watch created, cancelled, created again."""
    k = Kvd(KVD_TEST)
    w = Conn(k.port)
    w.send(b"POST /v3/watch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    lines = []
    for req in ('{"create_request":{"key":"YQ=="}}', '{"cancel_request":{"watch_id":"0"}}',
                '{"create_request":{"key":"Yg==","watch_id":"5"}}', '   ', '{"progress_request":{}}'):
        w.send(b"%x\r\n%s\r\n" % (len(req), req.encode()))
        if not lines:
            w.head()
        if req.strip():
            lines.append(json.loads(w.chunk())["result"])
    check([sorted(x.keys()) for x in lines] == [["created", "header"], ["canceled", "header"],
                                                ["created", "header", "watch_id"], ["header", "watch_id"]],
          "each request answered before the body ended: %r" % lines)
    w.send(b"0\r\n\r\n")  # the body ends; the stream goes on
    c = Conn(k.port)
    c.send(post("/v3/kv/put", '{"key":"Yg==","value":"eA=="}'))
    c.answer()
    ev = json.loads(w.chunk())["result"]
    check(ev.get("watch_id") == "5" and ev["events"][0]["kv"]["key"] == "Yg==", "then an event: %r" % ev)
    k.stop()


@test
def auth_like_etcd():
    e = Etcd()
    k = Kvd(KVD_TEST, ["--bcrypt-cost", "4"])
    for path, body in auth_steps():
        pair_check(e, k, post(path, body), "%s %s" % (path, body))
    toks = {}
    for name, srv in (("etcd", e), ("kvd", k)):
        for user, pw in (("root", "rootpw"), ("u", "upw")):
            st, hd, body, tr = Conn(srv.port).answer() if False else exchange(
                srv.port, post("/v3/auth/authenticate", '{"name":"%s","password":"%s"}' % (user, pw)))[0]
            check(st.endswith("200 OK"), "%s: %s logs in: %s %r" % (name, user, st, body))
            toks[name, user] = json.loads(body)["token"].encode()
    pair_check(e, k, post("/v3/auth/authenticate", '{"name":"u","password":"nope"}'), "a wrong password")
    for user, path, body in (("root", "/v3/kv/put", '{"key":"YQ==","value":"MQ=="}'),
                             ("u", "/v3/kv/range", '{"key":"YQ=="}'),
                             ("u", "/v3/kv/put", '{"key":"YQ==","value":"Mg=="}'),
                             ("u", "/v3/auth/user/list", "{}"),
                             ("root", "/v3/auth/user/get", '{"name":"u"}'),
                             (None, "/v3/kv/range", '{"key":"YQ=="}'),
                             ("bogus", "/v3/kv/range", '{"key":"YQ=="}')):
        a = []
        for name, srv in (("etcd", e), ("kvd", k)):
            tok = b"bogus" if user == "bogus" else toks[name, user] if user else None
            extra = b"Authorization: " + tok + b"\r\n" if tok else b""
            a.append(exchange(srv.port, post(path, body, extra))[0])
        check(a[0] == a[1], "%s as %s:\n   etcd %r\n   kvd  %r" % (path, user, a[0], a[1]))
        if user == "bogus":  # v2: a 401 says why in WWW-Authenticate
            check(a[1][0].startswith("HTTP/1.1 401") and ("Www-Authenticate", "etcdserver: invalid auth token") in
                  a[1][1], "401 with WWW-Authenticate: %r" % (a[1],))
    # a token in Grpc-Metadata-Token works the same
    a = [exchange(srv.port, post("/v3/kv/range", '{"key":"YQ=="}', b"Grpc-Metadata-Token: " + toks[n, "u"] +
                                 b"\r\n"))[0] for n, srv in (("etcd", e), ("kvd", k))]
    check(a[0] == a[1] and a[0][0].endswith("200 OK"), "Grpc-Metadata-Token: %r / %r" % (a[0], a[1]))
    # a stream refused before its first message: grpc-gateway's error chunk
    a = [exchange(srv.port, post("/v3/maintenance/snapshot", "{}", b"Authorization: " + toks[n, "u"] + b"\r\n"))[0]
         for n, srv in (("etcd", e), ("kvd", k))]
    check(a[0] == a[1], "snapshot refused: etcd %r / kvd %r" % (a[0], a[1]))
    e.stop()
    k.stop()


@test
def cors_like_etcd():
    """--cors with a list, beside etcd: an Origin on the list is echoed,
    one off it (or without its port) is not [§33.4]; on the gateway, on
    /health and on a preflight."""
    e = Etcd(["--cors", "http://a.example:8080,http://b.example:80"])
    k = Kvd(KVD_TEST, ["--cors", "http://a.example:8080,http://b.example:80"])
    for origin in (b"http://a.example:8080", b"http://b.example:80", b"http://c.example:80", b"http://a.example",
                   None):
        extra = b"Origin: " + origin + b"\r\n" if origin else b""
        pair_check(e, k, post("/v3/kv/range", '{"key":"YQ=="}', extra), "Origin %r" % origin)
        pair_check(e, k, b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n", "/health, Origin %r" % origin)
        pair_check(e, k, b"OPTIONS /v3/kv/put HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n", "OPTIONS, Origin %r" % origin)
    # a request refused on a kept-alive connection allows no origin, not the one before it allowed
    for srv in (e, k):
        st = exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://a.example:8080\r\n\r\n"
                      b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 2)
        check(len(st) == 2 and "access-control-allow-origin" in str(st[0]).lower() and
              st[1] != "closed" and "access-control-allow-origin" not in str(st[1]).lower(),
              "%s: the refused second request allows no origin: %.600r" % ("etcd" if srv is e else "kvd", st))
    e.stop()
    k.stop()


def stats(k):
    import grpc
    with grpc.insecure_channel(k.endpoint()) as ch:
        out = ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=10).decode()
    return dict(x.split("=", 1) for x in out.split() if "=" in x)


@test
def limits():
    """Bodies are bounded [§34.4]: over 2 x --max-request-bytes + 64 KiB
    is 413, a chunk size past 64 bits or a bad chunk line 400, a chunk past
    the limit 413; hostile JSON is refused.  A body that stops coming is
    closed after --max-idle-time while a watch being served outlives it
    [§35.4]; a client that goes away frees its call."""
    k = Kvd(KVD_TEST, ["--max-idle-time", "2s", "--max-request-bytes", "4096"])
    big = b"x" * 140000
    st = exchange(k.port, post("/v3/kv/put", b'{"key":"YQ==","value":"' + big + b'"}'))
    check(st[0][0].startswith("HTTP/1.1 413"), "a body over 2 x --max-request-bytes + 64 KiB: 413: %r" % (st[0][:1],))
    st = exchange(k.port, b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n")
    check(st[0][0].startswith("HTTP/1.1 400"), "a chunk size past 64 bits: 400: %r" % (st[0][:1],))
    st = exchange(k.port, b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n")
    check(st[0][0].startswith("HTTP/1.1 413"), "a chunk past the limit: 413: %r" % (st[0][:1],))
    st = exchange(k.port, b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    check(st[0][0].startswith("HTTP/1.1 400"), "a bad chunk line: 400: %r" % (st[0][:1],))
    # hostile JSON: deep nesting, a huge number, a flood of members
    for body, want in ((b"[" * 60000, "400"), (b"{" * 60000, "400"), (b'["' + b"\\" * 60000, "400"),
                       (b'{"key":"YQ==","limit":' + b"9" * 5000 + b"}", "400"),
                       (b"{" + b",".join(b'"k%d":[1,{"x":2}]' % i for i in range(2000)) + b',"key":"YQ=="}', "200")):
        st = exchange(k.port, post("/v3/kv/range", body))
        check(st[0] != "closed" and st[0][0].startswith("HTTP/1.1 " + want), "hostile JSON: %s: %.300r" %
              (want, st[0][:3],))
    # a watch, then a body that stops coming: that connection closes after
    # --max-idle-time; the watch outlives it; a client that goes away frees its call
    base = int(stats(k)["streams"])
    w = Conn(k.port, 30)
    w.send(post("/v3/watch", '{"create_request":{"key":"YQ=="}}'))
    w.head()
    w.chunk()
    check(wait_for(lambda: int(stats(k)["streams"]) == base + 1, 30), "the watch is a call")
    c = Conn(k.port, 30)
    c.send(b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"key\":")
    t = time.monotonic()
    try:
        c.answer()
        closed = False
    except (EOFError, ConnectionResetError):
        closed = True
    check(closed and time.monotonic() - t >= 1.5, "a stalled body: closed after the idle time (%.1f s)" %
          (time.monotonic() - t))
    c2 = Conn(k.port)
    c2.send(post("/v3/kv/put", '{"key":"YQ==","value":"MQ=="}'))
    c2.answer()
    got = w.chunk()
    check(b'"events"' in got, "the watch outlived --max-idle-time: %r" % got[:100])
    w.close()
    check(wait_for(lambda: int(stats(k)["streams"]) == base, 30), "the gone client's watch call freed")
    check(k.alive(), "kvd serves on")
    k.stop()


def carrier_faults(src):
    """What in kvd.c's section 34 (the gateway) is more than a carrier's."""
    sec = src[src.index("/* ===== 34. "):src.index("/* ===== 35. ")]
    routes = sec[sec.index("gw_routes[] = {"):]
    routes = routes[:routes.index("\n};\n")]
    rest = sec.replace(routes, "")
    out = ["an RPC named outside gw_routes: " + x for x in re.findall(r'"/(?:etcdserverpb|v3lockpb|v3electionpb|grpc)\.[^"]*"', rest)]
    out += ["a service or the store called: " + x for x in
            re.findall(r"\b(?:svc|mvcc|watch|lease|auth|lock|snap|life)_\w+\(", sec)]
    for need in ("json_pj_decode(", "call_message(", "gw_message_json(", "call_route("):
        if need not in rest:
            out.append("no " + need)
    return out


@test
def the_gateway_is_a_carrier():
    """The gateway is a carrier, no more [§34.1]: in kvd.c's section 34 no
    RPC is named outside gw_routes and no service or store function is
    called (svc_, mvcc_, watch_, lease_, auth_, lock_, snap_, life_); a
    body reaches the call through json_pj_decode and call_message, the call
    is routed by call_route, and answers come back from its queue through
    gw_message_json.  Each rule catches a planted fault."""
    src = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kvd.c")).read()
    check(carrier_faults(src) == [], "section 34 as it is: %r" % carrier_faults(src))
    at = src.index("static void gw_deliver(")
    for what, text in (
            ("an RPC named outside the table", src[:at] + 'static const char *planted = "/etcdserverpb.KV/Put";\n' + src[at:]),
            ("a handler called directly", src[:at] + "static void planted(struct kvd *k) { mvcc_flush(k); }\n" + src[at:]),
            ("a message that bypasses call_message", src.replace("call_message(", "planted_message(")),
            ("answers not read from the call's queue", src.replace("gw_message_json(", "planted_json("))):
        check(carrier_faults(text) != [], "%s is caught" % what)


@test
def curl():
    k = Kvd(KVD_TEST)
    url = "http://127.0.0.1:%d" % k.port

    def run(*a):
        return subprocess.run(["curl", "-s", "-S"] + list(a), capture_output=True, timeout=60)

    r = run("-X", "POST", url + "/v3/kv/put", "-d", '{"key":"%s","value":"%s"}' % (b64("greeting"), b64("hello")))
    check(r.returncode == 0 and b'"revision":"2"' in r.stdout, "curl put: %r" % r.stdout)
    w = subprocess.Popen(["curl", "-s", "-N", "-X", "POST", url + "/v3/watch", "-d",
                          '{"create_request":{"key":"%s"}}' % b64("greeting")], stdout=subprocess.PIPE)
    first = w.stdout.readline()
    check(b'"created":true' in first, "curl -N watch: created: %r" % first)
    run("-X", "POST", url + "/v3/kv/put", "-d", '{"key":"%s","value":"%s"}' % (b64("greeting"), b64("bye")))
    ev = json.loads(w.stdout.readline())
    check(base64.b64decode(ev["result"]["events"][0]["kv"]["value"]) == b"bye", "curl -N watch: the event: %r" % ev)
    w.terminate()
    w.wait()
    r = run("-X", "POST", url + "/v3/kv/range", "-H", "Expect: 100-continue", "-H", "Transfer-Encoding: chunked",
            "-d", '{"key":"%s"}' % b64("greeting"))
    body = json.loads(r.stdout)
    check(base64.b64decode(body["kvs"][0]["value"]) == b"bye", "curl, chunked with 100-continue: %r" % body)
    k.stop()


if __name__ == "__main__":
    main_guard(sys.argv)
