#!/usr/bin/python3
"""confd with real peers: kvd beside Debian's ganeti-confd 3.0.2 (the same
configuration, the same signed datagrams, replies compared), Ganeti's own
Python client against kvd in both modes, the keyspace mode and its scope
(--confd-keyspace-prefix, --confd-user with auth, a bounded listing), the key file
rules, the replay cache, hostile datagrams and a flood from several sources
while gRPC is in use.  Last line: "N passed, N failed"."""
import hashlib
import hmac
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Client, pb, check, test, run_tests, wait_for, spawn, free_port
import ganeticonf

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
GANETI_CONFD = "/usr/lib/ganeti/3.0/usr/sbin/ganeti-confd"
R = pb()["rpc"]
KEY = b"5f2b7c0e9a1d4e8b3c6f0a2d5e8b1c4f7a0d3e6b\n"  # 40 hex digits and the newline, as Ganeti writes it
CFG_KEY = "ganeti/config.data"
MISSING = object()


def udp_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def key_file(d, key=KEY, mode=0o600):
    path = os.path.join(d, "hmac.key")
    with open(path, "wb") as f:
        f.write(key)
    os.chmod(path, mode)
    return path


class Confd:
    """The test's own confd client: builds, signs and checks datagrams."""
    serial = [0]  # rsalts unique across clients: identical datagrams are replays

    def __init__(self, port, key=KEY, host="127.0.0.1", src=None, timeout=1.0):
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.s = socket.socket(fam, socket.SOCK_DGRAM)
        if src:
            self.s.bind((src, 0))
        self.s.settimeout(timeout)
        self.addr, self.key, self.n = (host, port), key, 0

    def msg(self, typ, query=MISSING, rsalt=None, protocol=1):
        self.n += 1
        Confd.serial[0] += 1
        m = {"protocol": protocol, "type": typ}
        if query is not MISSING:
            m["query"] = query
        m["rsalt"] = rsalt if rsalt is not None else "r%d-%d" % (os.getpid(), Confd.serial[0])
        return json.dumps(m) + "\n", m["rsalt"]  # Ganeti's client layout: spaces, trailing newline

    def datagram(self, msg, salt=None, mac=None, magic=b"plj0", key=None):
        salt = str(int(time.time())) if salt is None else salt
        if mac is None:
            mac = hmac.new(key or self.key, (salt + msg).encode(), hashlib.sha1).hexdigest()
        return magic + json.dumps({"msg": msg, "salt": salt, "hmac": mac}).encode()

    def send(self, data):
        self.s.sendto(data, self.addr)

    def recv(self):
        try:
            return self.s.recv(65536)
        except (socket.timeout, ConnectionRefusedError):
            return None

    def ask_raw(self, data):
        self.send(data)
        return self.recv()

    def ask(self, typ, query=MISSING, **kw):
        msg, rsalt = self.msg(typ, query)
        rep = self.ask_raw(self.datagram(msg, **kw))
        return self.check(rep, rsalt) if rep else None

    def check(self, rep, rsalt):
        """The reply's msg as a dict, after checking magic, layout and HMAC."""
        assert rep[:4] == b"plj0", rep[:20]
        env = json.loads(rep[4:])
        assert list(env) == ["hmac", "msg", "salt"] and env["salt"] == rsalt, env
        want = hmac.new(self.key, (env["salt"] + env["msg"]).encode(), hashlib.sha1).hexdigest()
        assert env["hmac"] == want, "bad reply hmac"
        m = json.loads(env["msg"])
        assert list(m) == ["protocol", "status", "answer", "serial"], m
        return m

    def barrier(self, limit=60):
        """Every datagram sent to kvd's socket before now that reached it
        has been handled: kvd reads its socket in order, so the answer to a
        signed PING sent after them comes after theirs (UDP may lose the
        PING, or a rate limit drop it: ask again).  Returns the other
        replies read meanwhile and how many PINGs kvd answered."""
        others, mine, answered = [], set(), 0
        old = self.s.gettimeout()
        self.s.settimeout(1.0)
        end = time.time() + limit
        try:
            while time.time() < end:
                msg, rsalt = self.msg(0)
                mine.add(rsalt)
                self.send(self.datagram(msg))
                while True:
                    rep = self.recv()
                    if rep is None:
                        break
                    salt = json.loads(rep[4:]).get("salt")
                    if salt not in mine:
                        others.append(rep)
                        continue
                    answered += 1
                    if salt == rsalt:
                        return others, answered
            raise AssertionError("no answer to a barrier PING in %d s" % limit)
        finally:
            self.s.settimeout(old)

    def close(self):
        self.s.close()


class GanetiConfd:
    """Debian's Haskell ganeti-confd 3.0.2 on loopback, under its own root."""

    def __init__(self, cfg, key=KEY):
        self.root = tempfile.mkdtemp(prefix="ganeti-confd-")
        for d in ("var/lib/ganeti", "var/run/ganeti", "var/log/ganeti"):
            os.makedirs(os.path.join(self.root, d))
        with open(os.path.join(self.root, "var/lib/ganeti/config.data"), "w") as f:
            json.dump(cfg, f)
        key_file(os.path.join(self.root, "var/lib/ganeti"), key, 0o400)
        self.port = udp_port()
        self.p = spawn([GANETI_CONFD, "-f", "--no-user-checks", "-b", "127.0.0.1", "-p", str(self.port)],
                                  env=dict(os.environ, GANETI_ROOTDIR=self.root), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        c = Confd(self.port, key, timeout=0.2)
        if not wait_for(lambda: c.ask(0) is not None, 60, 0.05):
            raise RuntimeError("ganeti-confd did not answer")
        c.close()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def kvd_confd(binary=KVD_TEST, ganeti=False, args=(), key=KEY, data_dir=None):
    d = tempfile.mkdtemp(prefix="kvd-confd-key-")
    port = udp_port()
    a = ["--confd-hmac-key-file", key_file(d, key), "--confd-listen", "127.0.0.1:%d" % port] + list(args)
    if ganeti:
        a += ["--confd-ganeti-config-key", CFG_KEY]
    k = Kvd(binary, a, data_dir=data_dir)
    k.confd_port, k.key_dir = port, d
    return k


def stats(c):
    raw = c.ch.unary_unary("/kvd.test.Test/Stats")(b"").decode()
    return dict(x.split("=", 1) for x in raw.split())


# ------------------------------------------------------------------ the differential

def same_value(a, b):
    """JSON equality; floats may differ by one ulp (ganeti-confd's own time
    conversion rounds a few timestamps one ulp away; kvd keeps the file's)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        return a == b or abs(a - b) <= 2 * abs(a) * 2.2e-16
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same_value(a[x], b[x]) for x in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b and type(a) == type(b)


def queries(cfg, r):
    """Every query type with every query shape ganeti-confd parses, and the odd cases."""
    nodes, insts = cfg["nodes"], cfg["instances"]
    names = [n["name"] for n in nodes.values()]
    inames = [i["name"] for i in insts.values()]
    ips = sorted({n.get("ip") for i in insts.values() for n in i["nics"] if n.get("ip")}) + ["203.0.113.250"]
    links = ["br0", "br1", "xen-br0", "nope"]
    node_q = names + [n.split(".")[0] for n in names] + list(nodes)[:2] + ["web", "nope", "", "node1.", "WEB"]
    inst_q = inames + [n.split(".")[0] for n in inames] + list(insts)[:2] + ["nope", "inst"]
    out = []
    for t in range(12):
        out += [(t, MISSING), (t, None), (t, "x"), (t, {})]
    for q in node_q:
        out += [(1, q), (7, q), (8, q)]
    for q in inst_q:
        out.append((9, q))
    for ip in ips:
        out += [(2, {"1": ip}), (2, {"1": ip, "0": r.choice(links)})]
    for _ in range(8):
        out.append((2, {"2": r.sample(ips, min(len(ips), 3)), "0": r.choice(links)}))
        out.append((3, {"3": [r.randint(0, 2) for _ in range(r.randint(0, 4))]}))
    out += [(2, {"2": []}), (2, "192.0.2.10"), (3, {"3": None}), (3, {"1": "x"}), (6, "br0"), (6, "br1"),
            (6, "xen-br0"), (6, "nope"), (6, {"1": "x"}), (1, {"1": "x", "2": ["a"], "0": "br0", "3": [1, 0]}),
            (7, {"0": "l"}), (9, {"2": ["a", "b\\\"c"]}), (1, "weird \"name\" \\ \u0001 \u007f 9"),
            (7, "tab\there"), (1, "\u000eH")]
    # CONFIG_QUERY paths: every path down a random walk, and broken ones
    for _ in range(40):
        v, path = cfg, ""
        while isinstance(v, (dict, list)) and v and r.random() < 0.85:
            if isinstance(v, dict):
                k = r.choice(sorted(v))
                v, path = v[k], path + "/" + k
            else:
                i = r.randrange(len(v))
                v, path = v[i], path + "/" + r.choice([str(i), "0%d" % i])
        out.append((10, path))
    out += [(10, p) for p in ("", "/", "cluster", "/cluster/", "//", "/nope", "/cluster/tags/9", "/cluster/tags/-1",
                              "/version", "/cluster/ipolicy/minmax/0/max", "/nodes")]
    return out


def both(ca, cb, dg):
    """The same datagram to both servers at once (the salt is a clock)."""
    ca.send(dg)
    cb.send(dg)
    return ca.recv(), cb.recv()


def exchange(ca, cb, typ, query):
    msg, rsalt = ca.msg(typ, query)
    a, b = both(ca, cb, ca.datagram(msg))
    return a, b, rsalt


def differential(seed):
    r = random.Random(seed)
    cfg = ganeticonf.build(seed)
    g = GanetiConfd(cfg)
    k = kvd_confd(ganeti=True)
    c = Client(k.endpoint())
    try:
        check(c.call("Put", R.PutRequest(key=CFG_KEY.encode(), value=json.dumps(cfg).encode()))[0] == "ok", "put")
        cg, ck = Confd(g.port), Confd(k.confd_port)
        exact = semantic = 0
        for typ, q in queries(cfg, r):
            a, b, rsalt = exchange(cg, ck, typ, q)
            if a is None or b is None:
                check(a is None and b is None, "seed %d type %d query %r: ganeti %r, kvd %r" % (seed, typ, q, a, b))
                continue
            if a == b:
                exact += 1
                continue
            ma, mb = cg.check(a, rsalt), ck.check(b, rsalt)
            ok = same_value(ma, mb)
            semantic += ok
            check(ok, "seed %d type %d query %r:\n    ganeti: %s\n    kvd:    %s" %
                  (seed, typ, q, json.dumps(ma)[:700], json.dumps(mb)[:700]))
        # what both must drop without a word (built at send time: the salt is a clock)
        m, _ = cg.msg(0)
        now = lambda: int(time.time())
        drops = [lambda: cg.datagram(m, magic=b"plj1"), lambda: cg.datagram(m, key=b"wrong\n"),
                 lambda: cg.datagram(m, salt=str(now() - 301)), lambda: cg.datagram(m, salt=str(now() + 301)),
                 lambda: cg.datagram(m, salt="%d.5" % now()), lambda: cg.datagram(m, salt="%d " % now()),
                 lambda: cg.datagram(m, salt="+%d" % now()), lambda: cg.datagram(m, salt="abc"),
                 lambda: cg.datagram(" " + m), lambda: cg.datagram(m, mac="0" * 40),
                 lambda: b"plj0{\"msg\":\"x\"}", lambda: b"plj0not json",
                 lambda: b"plj0" + json.dumps({"msg": m, "salt": str(now()), "hmac": "x", "x": 1}).encode()]
        for body in ('{"protocol": 1, "type": 99, "rsalt": "x"}', '{"protocol": 1, "type": "0", "rsalt": "x"}',
                     '{"protocol": 1, "type": 0}', '{"protocol": 1, "type": 0, "rsalt": "x", "extra": 1}',
                     '{"protocol": 1, "type": 3, "rsalt": "x", "query": {"3": ["0"]}}',
                     '{"protocol": 1, "type": 3, "rsalt": "x", "query": {"3": [5]}}',
                     '{"protocol": 1, "type": 0, "rsalt": "x", "query": 5}',
                     '{"protocol": 1, "type": 10, "rsalt": "x", "query": {"a": 1}}', '[1]', '{"protocol": 1'):
            drops.append(lambda body=body: cg.datagram(body))
        cg.s.settimeout(0.25)
        ck.s.settimeout(0.25)
        for i, mk in enumerate(drops):
            a, b = both(cg, ck, mk())

            check(a is None and b is None, "drop case %d: ganeti %r, kvd %r" % (i, a, b))
        cg.s.settimeout(1)
        ck.s.settimeout(1)
        # the edges of the window, second by second: the same verdicts
        for off in (-301, -300, 300, 301):
            a, b = both(cg, ck, cg.datagram(m, salt=str(now() + off)))
            check((a is None) == (b is None), "skew %+d: ganeti %s, kvd %s" % (off, a is not None, b is not None))
        now = int(time.time())
        # accepted by both: an upper-case hmac, a msg without its newline, a leading space in the salt
        for dg in (cg.datagram(m.rstrip("\n")), cg.datagram(m, salt=" %d" % now), cg.datagram(m, salt="0%d" % now)):
            a, b = both(cg, ck, dg)
            check(a is not None and a == b, "accepted by both: %r %r" % (a, b))
        upper = cg.datagram(m, mac=hmac.new(KEY, (str(now) + m).encode(), hashlib.sha1).hexdigest().upper(),
                            salt=str(now))
        a, b = both(cg, ck, upper)
        check(a is not None and a == b, "upper-case hmac")
        # a write to the key is visible to the next query
        cfg["cluster"]["cluster_name"] = "renamed.example.org"
        cfg["cluster"]["serial_no"] += 1
        c.call("Put", R.PutRequest(key=CFG_KEY.encode(), value=json.dumps(cfg).encode()))
        got = ck.ask(10, "/cluster/cluster_name")
        check(got and got["answer"] == "renamed.example.org" and got["serial"] == cfg["cluster"]["serial_no"],
              "the next query sees the new configuration: %r" % got)
        print("    seed %d: %d replies byte-identical to ganeti-confd's, %d equal as JSON, %d drops agree"
              % (seed, exact, semantic, len(drops)))
        cg.close()
        ck.close()
    finally:
        c.close()
        k.stop()
        g.stop()


@test
def differential_vs_ganeti_confd():
    for seed in (1, 2, 3):
        differential(seed)


# ------------------------------------------------------------------ Ganeti's client

def ganeti_client(port, keypath, queries, timeout=2.0, tamper=None):
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "test", "lib", "ganeticlient.py"), str(port), keypath,
                        json.dumps(queries), str(timeout)] + ([tamper] if tamper else []),
                       capture_output=True, text=True, timeout=120)
    return r.returncode, [json.loads(l) if not l.startswith("RAISED") else l for l in r.stdout.splitlines()], r.stderr


def silence(k, mode):
    """A wrong key, a timestamp 400 s off either way, a wrong magic: Ganeti's
    client sends, kvd stays silent; 300 s off is still answered."""
    d = tempfile.mkdtemp()
    keypath = os.path.join(k.key_dir, "hmac.key")
    for name, path, tamper, want in (("wrong key", key_file(d, b"0" * 40 + b"\n"), None, "NOREPLY"),
                                     ("400 s ahead", keypath, "skew:400", "NOREPLY"),
                                     ("400 s behind", keypath, "skew:-400", "NOREPLY"),
                                     ("bad magic", keypath, "magic:plj1", "NOREPLY"),
                                     ("299 s behind", keypath, "skew:-299", "answer")):
        rc, out, err = ganeti_client(k.confd_port, path, [[0, None]], 1.0, tamper)
        check(rc == 0 and len(out) == 1 and (out[0] == "NOREPLY") == (want == "NOREPLY"),
              "%s, %s: %s: %r %s" % (mode, name, want, out, err[-200:]))


@test
def ganeti_client_library():
    """Ganeti's own Python client (packing, signing, checking are Ganeti's)
    against kvd: every answer verifies and parses, in both modes."""
    cfg = ganeticonf.build(7)
    k = kvd_confd(ganeti=True)
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=CFG_KEY.encode(), value=json.dumps(cfg).encode()))
    master = cfg["nodes"][cfg["cluster"]["master_node"]]["name"]
    qs = [[t, None] for t in (0, 3, 4, 5, 6, 11)] + [[1, master], [1, "nope"], [3, {"3": [0, 1, 2]}],
                                                     [7, master], [9, cfg["instances"][list(cfg["instances"])[0]]["name"]],
                                                     [10, "/cluster/cluster_name"], [2, {"2": ["203.0.113.1"]}]]
    rc, out, err = ganeti_client(k.confd_port, os.path.join(k.key_dir, "hmac.key"), qs)
    check(rc == 0 and len(out) == len(qs) and "NOREPLY" not in out, "all answered: %d %r %s" % (rc, out, err[-300:]))
    check(out and out[0] == [0, 3000000, 0] and out[1][1] == master, "PING and CLUSTER_MASTER: %r" % out[:2])
    check(len(out) > 7 and out[6] == [0, 0, cfg["cluster"]["serial_no"]], "the master's role: %r" % out[6:7])
    silence(k, "Ganeti mode")
    c.close()
    k.stop()
    # keyspace mode
    k = kvd_confd()
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"cfg/wan/ip", value=b"192.0.2.1"))
    rc, out, err = ganeti_client(k.confd_port, os.path.join(k.key_dir, "hmac.key"),
                                 [[0, None], [10, "cfg/wan/ip"], [10, "cfg/"], [10, "missing"], [1, "x"]])
    check(rc == 0 and out == [[0, 2, 2], [0, "192.0.2.1", 2], [0, {"cfg/wan/ip": "192.0.2.1"}, 2], [1, 0, 0],
                              [2, None, 0]], "keyspace mode through Ganeti's client: %r %s" % (out, err[-300:]))
    silence(k, "keyspace mode")
    c.close()
    k.stop()


# ------------------------------------------------------------------ keyspace mode

@test
def keyspace_mode():
    """Keyspace mode's answers; one over the reply cap is ARGUMENT, never a
    truncated datagram. [§32.3]"""
    k = kvd_confd()
    c = Client(k.endpoint())
    q = Confd(k.confd_port)
    check(q.ask(0) == {"protocol": 1, "status": 0, "answer": 1, "serial": 1}, "PING: the store revision")
    c.call("Put", R.PutRequest(key=b"a/x", value=b"1"))
    c.call("Put", R.PutRequest(key=b"a/y", value="caf\u00e9 \"q\"\n".encode()))
    c.call("Put", R.PutRequest(key=b"a/bin", value=b"\xff\x00\x01"))
    c.call("Put", R.PutRequest(key=b"b", value=b"other"))
    check(q.ask(10, "a/x") == {"protocol": 1, "status": 0, "answer": "1", "serial": 2}, "a value, serial = mod_revision")
    check(q.ask(10, "a/y")["answer"] == "caf\u00e9 \"q\"\n", "UTF-8 value")
    check(q.ask(10, "a/bin")["answer"] == {"base64": "/wAB"}, "a binary value as base64")
    got = q.ask(10, "a/")
    check(got["answer"] == {"a/bin": {"base64": "/wAB"}, "a/x": "1", "a/y": "caf\u00e9 \"q\"\n"} and got["serial"] == 5,
          "a prefix: an object of its keys: %r" % got)
    check(q.ask(10, "zz/") == {"protocol": 1, "status": 0, "answer": {}, "serial": 5}, "an empty prefix")
    check(q.ask(10, "nope") == {"protocol": 1, "status": 1, "answer": 0, "serial": 0}, "unknown key: UNKNOWN_ENTRY")
    for bad in (MISSING, None, {"1": "x"}, ""):
        check(q.ask(10, bad) == {"protocol": 1, "status": 1, "answer": 2, "serial": 0}, "ARGUMENT for %r" % (bad,))
    for t in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11):
        check(q.ask(t, "x") == {"protocol": 1, "status": 2, "answer": None, "serial": 0}, "type %d: status 2" % t)
    # a write is visible to the very next query (and was durable before it)
    for i in range(20):
        c.call("Put", R.PutRequest(key=b"a/x", value=b"%d" % i))
        got = q.ask(10, "a/x")
        if got["answer"] != "%d" % i:
            break
    check(got["answer"] == "19", "read-your-write through confd")
    # an answer over the reply cap: ARGUMENT, never a truncated datagram
    t = R.TxnRequest()
    for i in range(100):
        t.success.add().request_put.CopyFrom(R.PutRequest(key=b"big/%03d" % i, value=b"v" * 1000))
    c.call("Txn", t)
    msg, rsalt = q.msg(10, "big/")
    raw = q.ask_raw(q.datagram(msg))
    check(raw and len(raw) < 61440 and q.check(raw, rsalt)["answer"] == 2, "over the cap: ARGUMENT")
    check(int(stats(c)["too-big"]) == 1, "counted")
    # the reply is ASCII even for non-ASCII data
    msg, rsalt = q.msg(10, "a/y")
    raw = q.ask_raw(q.datagram(msg))
    check(raw and all(b < 0x80 for b in raw), "ASCII-only datagram")
    q.close()
    c.close()
    k.stop()


# ------------------------------------------------------------------ keyspace mode's scope

AUTHPB = pb()["auth"]
ABSENT = {"protocol": 1, "status": 1, "answer": 0, "serial": 0}  # UNKNOWN_ENTRY: what an unreadable key looks like
ARGUMENT = {"protocol": 1, "status": 1, "answer": 2, "serial": 0}
AUTH_RPC = {"AuthEnable": "AuthEnable", "AuthDisable": "AuthDisable", "Authenticate": "Authenticate",
            "UserAdd": "AuthUserAdd", "UserGrantRole": "AuthUserGrantRole", "RoleAdd": "AuthRoleAdd",
            "RoleGrantPermission": "AuthRoleGrantPermission"}
COST = ["--bcrypt-cost", "4"]  # the ASan build hashes slowly; the cost is not what these tests are about


def rpc(c, method, req, token=None):
    """One Auth or KV call through grpcio, with a token if given: ('ok', msg) or ('err', code, text)."""
    if method in AUTH_RPC:
        svc, resp = "Auth", AUTH_RPC[method] + "Response"
    else:
        svc, resp = "KV", Client.RESP[method]
    f = c.ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method), request_serializer=lambda m: m.SerializeToString(),
                         response_deserializer=getattr(R, resp).FromString)
    try:
        return ("ok", f(req, timeout=60, metadata=[("token", token)] if token else None))
    except c.grpc.RpcError as e:
        return ("err", e.code().name, e.details())


def must(c, method, req, token=None):
    a = rpc(c, method, req, token)
    if a[0] != "ok":
        raise AssertionError("%s: %r" % (method, a))
    return a[1]


def enable_auth(c, extra=()):
    """root (password rootpw, role root), then what extra holds (method, request), then AuthEnable; root's token."""
    must(c, "UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"))
    must(c, "UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"))
    for m, req in extra:
        must(c, m, req)
    must(c, "AuthEnable", R.AuthEnableRequest())
    return must(c, "Authenticate", R.AuthenticateRequest(name="root", password="rootpw")).token


def reader(user, role, key, end=b""):
    """A user with a role that may read [key, end) (end empty: the one key)."""
    return [("UserAdd", R.AuthUserAddRequest(name=user, password=user + "pw")),
            ("RoleAdd", R.AuthRoleAddRequest(name=role)),
            ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name=role, perm=AUTHPB.Permission(
                permType=AUTHPB.Permission.READ, key=key, range_end=end))),
            ("UserGrantRole", R.AuthUserGrantRoleRequest(user=user, role=role))]


def put_many(c, keys, value=b"v", token=None):
    """Puts in Txns of 128 (--max-txn-ops' default)."""
    keys = list(keys)
    for i in range(0, len(keys), 128):
        t = R.TxnRequest()
        for key in keys[i:i + 128]:
            t.success.add().request_put.CopyFrom(R.PutRequest(key=key, value=value))
        must(c, "Txn", t, token)


def value(got):
    return got["answer"] if got and got["status"] == 0 else ("not answered", got)


@test
def keyspace_prefix_scopes_queries():
    """--confd-keyspace-prefix /app/: a query names a key relative to the
    prefix (a leading "/" is the prefix's own: "/a" is "a", "/" lists the
    whole scope), a listing names its keys relative to it, and nothing above
    it can be reached (".." and any further "/" are bytes of a key name). [§31.5]"""
    k = kvd_confd(args=["--confd-keyspace-prefix", "/app/"])
    c = Client(k.endpoint())
    q = Confd(k.confd_port)
    for key, v in ((b"/app/a", b"1"), (b"/app/b", b"2"), (b"/app/sub/c", b"3"), (b"/app/sub/d/e", b"4"),
                   (b"/secret/x", b"s"), (b"/app-other/z", b"o"), (b"a", b"top-a"), (b"sub/c", b"top-c")):
        must(c, "Put", R.PutRequest(key=key, value=v))
    check(q.ask(0)["status"] == 0, "PING answered")
    got = q.ask(10, "a")
    check(got and got["status"] == 0 and got["answer"] == "1", "query a reads /app/a (not the key a): %r" % got)
    check(value(q.ask(10, "sub/c")) == "3", "query sub/c reads /app/sub/c (not the key sub/c)")
    check(value(q.ask(10, "/a")) == "1" and value(q.ask(10, "/sub/c")) == "3", "a leading / is the prefix's: /a is a")
    for out in ("../secret/x", "/secret/x", "//secret/x", "../../secret/x", "./../secret/x", "secret/x", "../app-other/z",
                "-other/z", "x", "/../secret/x"):
        check(q.ask(10, out) == ABSENT, "query %r: absent (it names a key under /app/)" % (out,))
    # a listing: its keys named relative to the prefix, never one outside it
    got = q.ask(10, "sub/")
    check(got and got["status"] == 0 and got["answer"] == {"sub/c": "3", "sub/d/e": "4"},
          "sub/ lists /app/sub/..., keys relative to the prefix: %r" % got)
    check(value(q.ask(10, "sub/d/")) == {"sub/d/e": "4"}, "a deeper listing: relative to the prefix, not the query")
    scope = {"a": "1", "b": "2", "sub/c": "3", "sub/d/e": "4"}
    check(value(q.ask(10, "/")) == scope, "/ lists the whole scope, relative names, nothing outside: %r" %
          (value(q.ask(10, "/")),))
    for out in ("../", "/secret/", "../secret/", "//", "nope/", "-other/", "./"):
        check(value(q.ask(10, out)) == {}, "listing %r: empty (it lists a prefix under /app/)" % (out,))
    check(q.ask(10, "") == ARGUMENT, "an empty query: ARGUMENT, as ever")
    # the literal key "/app/../secret/x" is under the prefix: answered (no path rules, only bytes)
    must(c, "Put", R.PutRequest(key=b"/app/../secret/x", value=b"in scope"))
    check(value(q.ask(10, "../secret/x")) == "in scope", "the key /app/../secret/x itself is in scope")
    check(value(q.ask(10, "../")) == {"../secret/x": "in scope"}, "and listed as ../secret/x")
    q.close()
    c.close()
    k.stop()
    # the default prefix "": every key, named as stored (the old behaviour)
    k = kvd_confd()
    c = Client(k.endpoint())
    q = Confd(k.confd_port)
    must(c, "Put", R.PutRequest(key=b"/app/a", value=b"1"))
    must(c, "Put", R.PutRequest(key=b"/secret/x", value=b"s"))
    check(value(q.ask(10, "/secret/x")) == "s" and value(q.ask(10, "/")) == {"/app/a": "1", "/secret/x": "s"},
          "no prefix: every key, full names")
    q.close()
    c.close()
    k.stop()


@test
def keyspace_with_auth_needs_a_user():
    """With auth enabled, keyspace mode answers as --confd-user may read; no
    --confd-user: kvd does not start (exit 2); an unreadable key is answered
    as absent. [§31.5]"""
    k = Kvd(KVD_TEST, COST)
    d = k.dir
    c = Client(k.endpoint())
    for key, v in ((b"/pub/x", b"px"), (b"/pub/z", b"pz"), (b"/priv/y", b"secret"), (b"/pubx", b"beside")):
        must(c, "Put", R.PutRequest(key=key, value=v))
    enable_auth(c, reader("alice", "pubread", b"/pub/", b"/pub0"))
    c.close()
    check(k.stop() == 0, "stopped")
    kd = tempfile.mkdtemp(prefix="kvd-confd-key-")
    base = [KVD_TEST, "--data-dir", d, "--listen-client-urls", "http://127.0.0.1:%d" % free_port(),
            "--confd-hmac-key-file", key_file(kd), "--confd-listen", "127.0.0.1:%d" % udp_port()] + COST
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    for extra, what in (([], "no --confd-user"), (["--confd-user", ""], "an empty --confd-user")):
        try:
            r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120, env=env)
            rc, err = r.returncode, r.stderr
        except subprocess.TimeoutExpired as e:  # it started and served
            rc, err = "still running after 120 s", (e.stderr or b"").decode(errors="replace")
        check(rc == 2 and "--confd-user" in err,
              "auth on, keyspace mode, %s: exit 2 naming --confd-user: %s %r" % (what, rc, err[-500:]))
    # alice: /pub/ only
    k = kvd_confd(args=COST + ["--confd-user", "alice"], data_dir=d)
    q = Confd(k.confd_port)
    check(value(q.ask(10, "/pub/x")) == "px", "alice may read /pub/x: answered")
    check(q.ask(10, "/priv/y") == ABSENT, "/priv/y exists, alice may not read it: absent")
    check(q.ask(10, "/pubx") == ABSENT, "/pubx (outside [/pub/, /pub0)): absent")
    check(value(q.ask(10, "/")) == {"/pub/x": "px", "/pub/z": "pz"}, "the / listing: only what alice may read")
    check(value(q.ask(10, "/pub/")) == {"/pub/x": "px", "/pub/z": "pz"}, "/pub/ (all readable): every key")
    check(value(q.ask(10, "/priv/")) == {}, "/priv/: empty")
    q.close()
    k.stop()
    # alice with a prefix: both scopes at once
    k = kvd_confd(args=COST + ["--confd-user", "alice", "--confd-keyspace-prefix", "/p"], data_dir=d)
    q = Confd(k.confd_port)
    check(value(q.ask(10, "ub/x")) == "px" and q.ask(10, "riv/y") == ABSENT and
          value(q.ask(10, "ub/")) == {"ub/x": "px", "ub/z": "pz"}, "prefix and user together")
    q.close()
    k.stop()
    # a user that does not exist reads nothing
    k = kvd_confd(args=COST + ["--confd-user", "nobody"], data_dir=d)
    q = Confd(k.confd_port)
    check(q.ask(10, "/pub/x") == ABSENT and value(q.ask(10, "/")) == {}, "--confd-user nobody: nothing")
    q.close()
    k.stop()
    # the positive control: root reads everything
    k = kvd_confd(args=COST + ["--confd-user", "root"], data_dir=d)
    q = Confd(k.confd_port)
    check(value(q.ask(10, "/priv/y")) == "secret", "root sees /priv/y")
    check(value(q.ask(10, "/")) == {"/pub/x": "px", "/pub/z": "pz", "/priv/y": "secret", "/pubx": "beside"},
          "root's / listing: every key")
    q.close()
    k.stop()
    # Ganeti mode reads the one key it is told to: no --confd-user needed
    k = kvd_confd(args=COST, data_dir=d, ganeti=True)
    check(k.alive(), "Ganeti mode starts with auth on")
    k.stop()


@test
def auth_enabled_at_run_time_closes_keyspace():
    """Auth enabled while kvd runs keyspace mode without --confd-user:
    keyspace queries get nothing from then on (a warning, once)."""
    k = kvd_confd(args=COST)
    c = Client(k.endpoint())
    q = Confd(k.confd_port)
    must(c, "Put", R.PutRequest(key=b"d/k", value=b"v"))
    check(value(q.ask(10, "d/k")) == "v" and value(q.ask(10, "d/")) == {"d/k": "v"}, "auth off: answered")
    token = enable_auth(c)
    for _ in range(3):
        check(q.ask(10, "d/k") == ABSENT, "auth on, no --confd-user: d/k absent")
        check(value(q.ask(10, "d/")) == {}, "auth on, no --confd-user: an empty listing")
    check(wait_for(lambda: "confd-user" in k.logtext(), 60), "a warning naming --confd-user: %s" % k.logtext()[-500:])
    k.p.send_signal(signal.SIGHUP)  # a line logged after every query above was handled
    check(wait_for(lambda: "SIGHUP: reading" in k.logtext(), 60), "SIGHUP logged")
    check(q.ask(10, "d/k") == ABSENT, "still absent")
    q.barrier()
    k.p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: k.logtext().count("SIGHUP: reading") == 2, 60), "SIGHUP logged again")
    warned = [l for l in k.logtext().splitlines() if "confd-user" in l]
    check(len(warned) == 1 and " W | " in warned[0], "the warning, once: %r" % warned)
    # auth off again: answered again
    must(c, "AuthDisable", R.AuthDisableRequest(), token)
    check(value(q.ask(10, "d/k")) == "v", "auth off again: answered")
    check(k.alive(), "alive")
    q.close()
    c.close()
    k.stop()


@test
def listing_is_bounded():
    """A "/" query looks at no more than 10000 keys (readable or not):
    past that, ARGUMENT; a query for one key is still answered. [§31.5]"""
    k = kvd_confd(args=COST + ["--confd-user", "alice"])
    c = Client(k.endpoint())
    q = Confd(k.confd_port)
    put_many(c, (b"/many/%05d" % i for i in range(10000)))
    check(value(q.ask(10, "/many/00005")) == "v", "one of 10000: answered")
    # alice may read one of them: her listing is small, what it looks at is not
    token = enable_auth(c, reader("alice", "one", b"/many/00000"))
    check(value(q.ask(10, "/many/")) == {"/many/00000": "v"}, "10000 keys looked at: answered")
    must(c, "Put", R.PutRequest(key=b"/many/10000", value=b"v"), token)
    before = int(stats(c)["too-big"])
    check(q.ask(10, "/many/") == ARGUMENT, "10001 keys to look at: ARGUMENT, although the answer would be one key")
    check(int(stats(c)["too-big"]) == before + 1, "counted as too big")
    check(value(q.ask(10, "/many/00000")) == "v", "a query for one key still answered")
    check(q.ask(10, "/many/10000") == ABSENT, "and one alice may not read still absent")
    check(value(q.ask(10, "/man/")) == {} and value(q.ask(10, "/many0/")) == {}, "listings beside it: fine")
    # auth off: 10001 keys, every one readable
    must(c, "AuthDisable", R.AuthDisableRequest(), token)
    check(q.ask(10, "/many/") == ARGUMENT, "auth off, 10001 keys: ARGUMENT")
    check(value(q.ask(10, "/many/10000")) == "v" and value(q.ask(10, "/many/00005")) == "v",
          "a query for one of them: answered")
    check(k.alive(), "alive")
    q.close()
    c.close()
    k.stop()


@test
def readme_shell_one_liner():
    """The README's shell example (openssl + nc), run as written."""
    with open(os.path.join(ROOT, "README.md")) as f:
        line = [l.strip() for l in f if "openssl dgst" in l and "nc -u" in l]
    check(len(line) == 1, "the README has the example")
    k = kvd_confd()
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"cfg/wan/ip", value=b"192.0.2.1"))
    cmd = line[0].replace("127.0.0.1 1814", "127.0.0.1 %d" % k.confd_port)
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=10,
                       env=dict(os.environ, KEY=KEY.hex()))
    env = json.loads(r.stdout[4:]) if r.stdout[:4] == b"plj0" else {}
    check(env and json.loads(env["msg"])["answer"] == "192.0.2.1" and
          env["hmac"] == hmac.new(KEY, (env["salt"] + env["msg"]).encode(), hashlib.sha1).hexdigest(),
          "answered and signed: %r %r" % (r.stdout[:200], r.stderr[-200:]))
    c.close()
    k.stop()


@test
def ipv6_and_skew_off():
    k = kvd_confd(args=["--confd-max-clock-skew", "0"])
    k.stop()
    port = udp_port()
    d = tempfile.mkdtemp()
    k = Kvd(KVD_TEST, ["--confd-hmac-key-file", key_file(d), "--confd-listen", "[::1]:%d" % port,
                       "--confd-max-clock-skew", "0"])
    q = Confd(port, host="::1")
    check(q.ask(0) is not None, "IPv6")
    check(q.ask(0, salt="12") is not None, "--confd-max-clock-skew 0: a board without a clock still answers")
    q.close()
    k.stop()


@test
def key_file_rules_and_reload():
    """A key file others may read is refused; SIGHUP reads the key again,
    and one that fails to load leaves the old key in place. [§31.1]"""
    d = tempfile.mkdtemp()
    path = key_file(d, mode=0o644)
    r = subprocess.run([KVD, "--data-dir", os.path.join(d, "data"), "--listen-client-urls", "http://127.0.0.1:0",
                        "--confd-hmac-key-file", path], capture_output=True, text=True, timeout=10)
    check(r.returncode == 2 and "readable or writable by group or others" in r.stderr, "0644 refused: %r" % r.stderr)
    r = subprocess.run([KVD, "--data-dir", os.path.join(d, "data"), "--confd-hmac-key-file", os.path.join(d, "nope")],
                       capture_output=True, text=True, timeout=10)
    check(r.returncode == 2 and "No such file" in r.stderr and not os.path.exists(os.path.join(d, "data")),
          "missing key file: a configuration error, found before the data dir: %r" % r.stderr)
    k = kvd_confd()
    q = Confd(k.confd_port)
    check(q.ask(0) is not None, "old key")
    new = b"a" * 40 + b"\n"
    key_file(k.key_dir, new)
    k.p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: "confd: key reloaded" in k.logtext(), 60), "SIGHUP: key reloaded")
    check(q.ask(0) is None, "old key refused after SIGHUP")
    q2 = Confd(k.confd_port, key=new)
    check(q2.ask(0) is not None, "new key works")
    os.chmod(os.path.join(k.key_dir, "hmac.key"), 0o644)
    k.p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: "key not reloaded" in k.logtext(), 60), "a bad key file on reload says so")
    check(q2.ask(0) is not None, "and keeps the old key")
    q.close()
    q2.close()
    k.stop()


@test
def replay_cache():
    for args, answers in (([], 1), (["--confd-replay-cache=false"], 2)):
        k = kvd_confd(args=args)
        q = Confd(k.confd_port)
        msg, rsalt = q.msg(0)
        dg = q.datagram(msg)
        got = [q.ask_raw(dg) for _ in range(2)]
        check(sum(x is not None for x in got) == answers, "%r: %d answers to one datagram sent twice" % (args, answers))
        q.close()
        k.stop()


# ------------------------------------------------------------------ abuse

@test
def hostile_datagrams():
    """Junk of every kind: silence, counters, kvd alive and its memory back
    where it was; datagrams over 4096 bytes dropped as truncated. [§32.1] [§32.4]"""
    k = kvd_confd(ganeti=True)
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=CFG_KEY.encode(), value=b"{not json"))
    q = Confd(k.confd_port, timeout=0.05)
    base = int(stats(c)["mem"])
    r = random.Random(5)
    junk = [b"", b"plj0", b"plj0" + b"x" * 5000, b"plj0" + b"[" * 5000, b"plj0{" + b"\"a\":{" * 2000,
            q.datagram("{" + "\"a\":[" * 100 + "}"), q.datagram('{"protocol":1,"type":0,"rsalt":"' + "x" * 3500 + '"}'),
            b"plj0{\"msg\":\"\xff\xfe\",\"salt\":\"1\",\"hmac\":\"" + b"0" * 40 + b"\"}"]
    junk += [bytes(r.randrange(256) for _ in range(r.randint(0, 300))) for _ in range(300)]
    junk += [b"plj0" + bytes(r.randrange(256) for _ in range(r.randint(0, 300))) for _ in range(300)]
    for j in junk:
        q.send(j)
    got = len(q.barrier()[0])
    check(got <= 1, "no replies to junk (at most the signed one with a long rsalt): %d" % got)
    q.s.settimeout(1)
    check(q.ask(0) == {"protocol": 1, "status": 1, "answer": "kvd: cannot load the Ganeti configuration: "
                       "invalid character 'n' looking for beginning of object key string", "serial": 0}, "a broken configuration: status 1 with why")
    check(k.alive(), "alive")
    s = stats(c)
    check(int(s["mem"]) - base < 256 * 1024, "memory back: +%d" % (int(s["mem"]) - base))
    big = sum(len(j) > 4096 for j in junk)
    check(int(s["dropped-truncated"]) == big, "datagrams over 4096 bytes dropped as truncated: %s of %d" %
          (s["dropped-truncated"], big))
    c.close()
    q.close()
    k.stop()


@test
def rate_limits():
    """A source over --confd-rate-limit loses the excess (counted) while
    another source is still answered; --confd-global-rate-limit caps all
    sources together.  Bounds allow for the refill during the burst."""
    for args, per_source in ((["--confd-rate-limit", "50"], True), (["--confd-global-rate-limit", "80"], False)):
        k = kvd_confd(args=args)
        c = Client(k.endpoint())
        limit = 50 if per_source else 80
        srcs = ["127.0.0.2"] if per_source else ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        qs = [Confd(k.confd_port, src=s, timeout=0.05) for s in srcs]
        t0 = time.time()
        for i in range(300):
            for q in qs:
                q.send(q.datagram(q.msg(0)[0]))
        # from a source of its own: the burst's replies are in before its
        b = Confd(k.confd_port, src="127.0.0.5")
        _, pings = b.barrier()
        b.close()
        got = 0
        for q in qs:
            while q.recv() is not None:
                got += 1
        took = time.time() - t0
        s = stats(c)
        dropped = int(s["dropped-source-rate" if per_source else "dropped-rate"])
        seen = int(s["received"])  # loopback may drop a few of the burst itself
        check(limit <= got <= limit + limit * took + 1 and got + pings == int(s["answered"]) and
              int(s["answered"]) + sum(int(v) for key, v in s.items() if key.startswith("dropped-")) == seen,
              "%s: %d of %d answered in %.2f s, %d dropped and counted" % (args[0], got, seen, took, dropped))
        if per_source:
            other = Confd(k.confd_port, src="127.0.0.3")
            check(other.ask(0) is not None, "another source is still answered")
            other.close()
        else:
            time.sleep(0.1)  # refill: the global bucket gives 8 tokens per 100 ms
            qs[0].s.settimeout(1)
            check(qs[0].ask(0) is not None, "answered again after the refill")
        for q in qs:
            q.close()
        c.close()
        k.stop()


@test
def flood_from_several_sources():
    """100k bad and 100k valid datagrams from four source addresses while a
    gRPC client keeps calling and a polite confd client keeps asking: both
    stay served, memory stays bounded, every datagram is counted once. [§32.4]"""
    k = kvd_confd(args=["--confd-rate-limit", "1000000"])  # test rate_limits covers the limits
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"k", value=b"v"))
    base = int(stats(c)["mem"])
    sources = ["127.0.0.%d" % i for i in (2, 3, 4, 5)]
    stop, lat, polite = threading.Event(), [], [0, 0, 0]  # queries, answered, datagrams

    def grpc_user():
        cc = Client(k.endpoint())
        while not stop.is_set():
            t0 = time.time()
            ok = cc.call("Range", R.RangeRequest(key=b"k"))[0] == "ok"
            lat.append((time.time() - t0, ok))
        cc.close()

    def polite_user():  # asks again after a timeout, as Ganeti's client does: UDP may lose one
        pq = Confd(k.confd_port, src="127.0.0.9", timeout=1.0)
        while not stop.is_set():
            polite[0] += 1
            for _ in range(5):
                polite[2] += 1
                if pq.ask(10, "k") is not None:
                    polite[1] += 1
                    break
            time.sleep(0.01)
        pq.close()
    th = [threading.Thread(target=grpc_user), threading.Thread(target=polite_user)]
    for t in th:
        t.start()
    sent = 0
    r = random.Random(9)
    for i, src in enumerate(sources):
        q = Confd(k.confd_port, src=src)
        q.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        valid = []
        for j in range(25000):
            msg, _ = q.msg(0)
            valid.append(q.datagram(msg))
        bad = [q.datagram(q.msg(0)[0], key=b"bad\n") if j % 2 else b"plj0" + bytes(r.randrange(256) for _ in range(40))
               for j in range(25000)]
        for j in range(25000):
            for dg in (valid[j], bad[j]):
                while True:
                    try:
                        q.send(dg)
                        break
                    except BlockingIOError:
                        time.sleep(0.001)
                sent += 1
            if j % 64 == 63:  # closed loop: at most ~128 datagrams in kvd's socket buffer, so the kernel drops none
                deadline = time.time() + 2
                while int(stats(c)["received"]) < sent - 64 and time.time() < deadline:
                    time.sleep(0.0005)
        q.close()
    wait_for(lambda: int(stats(c)["received"]) >= sent, 30)
    stop.set()
    for t in th:
        t.join(10)
    s = stats(c)
    received = int(s["received"])
    accounted = int(s["answered"]) + sum(int(v) for key, v in s.items() if key.startswith("dropped-")) + \
        int(s["send-errors"])
    print("    " + " ".join("%s=%s" % kv for kv in s.items() if kv[0] not in ("peak", "conns", "streams", "accepted", "refused", "goaway", "rst")))
    print("    sent %d (+%d polite); kvd received %d: answered %s, dropped hmac %s, magic %s, envelope %s, source-rate %s, rate %s"
          % (sent, polite[2], received, s["answered"], s["dropped-hmac"], s["dropped-magic"], s["dropped-envelope"],
             s["dropped-source-rate"], s["dropped-rate"]))
    bad = int(s["dropped-hmac"]) + int(s["dropped-envelope"]) + int(s["dropped-magic"])
    limited = int(s["dropped-source-rate"]) + int(s["dropped-rate"])
    check(0.95 * sent <= received <= sent + polite[2] and accounted == received,
          "every datagram kvd received counted once: %d vs %d, of %d sent" % (accounted, received, sent))
    check(int(s["answered"]) + limited == received - bad and int(s["answered"]) >= 95000,
          "every valid one answered unless rate-limited: %s answered" % s["answered"])
    check(all(ok for _, ok in lat) and len(lat) > 20, "gRPC served throughout: %d calls, max %.0f ms" %
          (len(lat), 1000 * max(t for t, _ in lat) if lat else -1))
    check(polite[1] == polite[0], "the polite client answered: %d of %d (%d datagrams)" % (polite[1], polite[0], polite[2]))
    check(int(s["mem"]) - base < 2 * 1024 * 1024, "memory bounded: +%d" % (int(s["mem"]) - base))
    check(k.alive(), "alive")
    c.close()
    k.stop()


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
