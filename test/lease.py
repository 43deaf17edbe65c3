#!/usr/bin/python3
"""Leases with real clients: etcdctl 3.4 lease commands side by side with
etcd, expiry after keep-alives stop, `etcdctl lock` and `etcdctl elect` with
three contending clients, python3-etcd3 leases and locks, etcd's errors and
flag rules, and 100k leases (expiry, idle CPU, RSS, restart).
Last line: "N passed, N failed"."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import ROOT, Kvd, Etcd, Client, pb, check, check_script, test, run_tests, etcdctl, wait_for, grpc_frame, spawn

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
R = pb()["rpc"]
LEASE = "etcdserverpb.Lease"


def lcall(c, method, req, timeout=10):
    return c.call(method, req, service=LEASE, resp=method + "Response", timeout=timeout)


def ctl_env():
    return dict(os.environ, ETCDCTL_API="3")


def ctl_popen(server, *args):
    return spawn(["etcdctl", "--endpoints", server.endpoint()] + list(args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ctl_env())


@test
def etcdctl_lease_side_by_side():
    """The same etcdctl lease session against etcd and kvd: identical output
    and exit codes once lease ids and a second of remaining TTL are masked."""
    def session(server):
        out = []
        rc, o, err = etcdctl(server, "lease", "grant", "60")
        lid = o.split()[1] if rc == 0 else "0"
        steps = [["put", "--lease=" + lid, "k1", "v1"], ["put", "--lease=" + lid, "k2", "v2"],
                 ["lease", "timetolive", lid], ["lease", "timetolive", "--keys", lid],
                 ["lease", "keep-alive", "--once", lid], ["lease", "list"], ["get", "--prefix", "k"],
                 ["put", "--lease=" + lid, "k1", "v3"], ["put", "k2", "v4"], ["lease", "timetolive", "--keys", lid],
                 ["lease", "revoke", lid], ["get", "--prefix", "k"], ["lease", "timetolive", lid],
                 ["lease", "keep-alive", "--once", lid], ["lease", "revoke", lid], ["put", "--lease=1234", "k", "v"],
                 ["lease", "grant", "0"], ["lease", "grant", "9000000001"], ["lease", "revoke", "0"]]
        out.append((rc, o, err))
        for s in steps:
            out.append(etcdctl(server, *s))
        return out

    def norm(t):
        t = re.sub(kvdtest.HEX_ID, "ID", t)
        t = re.sub(r"remaining\((\d+)s\)", lambda m: "remaining(%s)" % ("~60" if int(m.group(1)) >= 58 else
                                                                         m.group(1)), t)
        return re.sub(r"keys\(\[([^\]]*)\]\)", lambda m: "keys([%s])" % " ".join(sorted(m.group(1).split())), t)
    e, k = Etcd(), Kvd(KVD_TEST)
    try:
        a, b = session(e), session(k)
        for i, (x, y) in enumerate(zip(a, b)):
            same = x[0] == y[0] and norm(x[1]) == norm(y[1]) and norm(x[2]).split("\n")[-2:] == \
                norm(y[2]).split("\n")[-2:]
            check(same, "step %d:\n    etcd: %r\n    kvd:  %r" % (i, x, y))
        check(len(a) == len(b) == 20, "all steps ran")
    finally:
        e.stop()
        k.stop()


@test
def expiry_after_keepalive_stops():
    """etcdctl lease keep-alive holds a 3 s lease past its TTL; once it is
    killed the key goes within TTL + 1 s."""
    k = Kvd(KVD_TEST)
    rc, o, _ = etcdctl(k, "lease", "grant", "3")
    lid = o.split()[1]
    etcdctl(k, "put", "--lease=" + lid, "alive", "yes")
    ka = ctl_popen(k, "lease", "keep-alive", lid)
    time.sleep(5)
    check(etcdctl(k, "get", "alive")[1] == "alive\nyes\n", "still there after 5 s of keep-alives")
    ka.kill()
    ka.wait()
    t0 = time.time()
    gone = wait_for(lambda: etcdctl(k, "get", "alive")[1] == "", 60, 0.05)
    took = time.time() - t0
    check(gone, "key gone once keep-alives stopped (TTL 3)")
    print("    key gone %.2f s after keep-alives stopped (TTL 3 s)" % took)
    out = ka.stdout.read().decode()
    check("keepalived with TTL(3)" in out, "keep-alive output: %r" % out[:200])
    rc, o, _ = etcdctl(k, "lease", "timetolive", lid)
    check("already expired" in o, "timetolive after expiry: %r" % o)
    k.stop()


@test
def etcdctl_lock_three_clients():
    """Three `etcdctl lock` runs of a command: never two inside at once, all
    three get in; a holder that dies hands over once its session lease expires."""
    k = Kvd(KVD_TEST)
    d = tempfile.mkdtemp(prefix="kvd-lock-")
    log, script = os.path.join(d, "log"), os.path.join(d, "inside.sh")
    with open(script, "w") as f:
        f.write('echo "start $$" >> %s; sleep 0.4; echo "end $$" >> %s\n' % (log, log))
    ps = [ctl_popen(k, "lock", "--ttl=5", "mylock", "sh", script) for _ in range(3)]
    rcs = [p.wait(120) for p in ps]
    lines = open(log).read().split("\n")[:-1] if os.path.exists(log) else [p.communicate()[1] for p in ps]
    subprocess.run(["rm", "-rf", d])
    pairs = [(lines[i], lines[i + 1]) for i in range(0, len(lines) - 1, 2)]
    check(rcs == [0, 0, 0] and len(lines) == 6, "three runs: %r %r" % (rcs, lines))
    check(all(a.split()[0] == "start" and b.split()[0] == "end" and a.split()[1] == b.split()[1] for a, b in pairs),
          "mutual exclusion: %r" % lines)
    # hand-over when the holder dies
    p1 = ctl_popen(k, "lock", "--ttl=2", "held")
    first = p1.stdout.readline().decode()
    check(first.startswith("held/"), "first holder: %r" % first)
    p2 = ctl_popen(k, "lock", "--ttl=2", "held")
    got = []
    threading.Thread(target=lambda: got.append(p2.stdout.readline().decode()), daemon=True).start()
    time.sleep(1.5)
    check(not got, "the second waits while the first lives")
    p1.kill()
    p1.wait()
    t0 = time.time()
    check(wait_for(lambda: got, 60), "the second got the lock after the first died")
    check(got and got[0].startswith("held/") and got[0] != first, "a new lock key: %r" % got)
    print("    hand-over %.2f s after the holder died (session TTL 2 s)" % (time.time() - t0))
    p2.send_signal(signal.SIGINT)
    p2.wait(60)
    check(wait_for(lambda: etcdctl(k, "get", "--prefix", "held/")[1] == "", 60), "released on exit")
    k.stop()


@test
def etcdctl_elect_three_candidates():
    """Three `etcdctl elect` candidates and an observer: one leader at a
    time, in campaign order, each resignation hands over."""
    k = Kvd(KVD_TEST)
    obs = ctl_popen(k, "elect", "-l", "myelection")
    seen = []
    threading.Thread(target=lambda: [seen.append(l.decode().strip()) for l in iter(obs.stdout.readline, b"")],
                     daemon=True).start()
    campaigns = lambda: len(etcdctl(k, "get", "--prefix", "--keys-only", "myelection/")[1].split())
    cands, outs = [], []
    for i, name in enumerate(("p1", "p2", "p3")):
        p = ctl_popen(k, "elect", "myelection", name)
        buf = []
        threading.Thread(target=lambda p=p, buf=buf: [buf.append(l.decode()) for l in iter(p.stdout.readline, b"")],
                         daemon=True).start()
        cands.append(p)
        outs.append(buf)
        check(wait_for(lambda: campaigns() == i + 1, 60), "%s campaigns (in order)" % name)
    leaders = lambda: [i for i, b in enumerate(outs) if any(l.strip() == "p%d" % (i + 1) for l in b)]
    check(wait_for(lambda: leaders() == [0], 60) and leaders() == [0], "p1 leads alone: %r" % outs)
    cands[0].send_signal(signal.SIGINT)
    cands[0].wait(60)
    check(wait_for(lambda: leaders() == [0, 1], 60), "p2 leads after p1 resigned: %r" % outs)
    cands[1].send_signal(signal.SIGINT)
    cands[1].wait(60)
    check(wait_for(lambda: leaders() == [0, 1, 2], 60), "p3 leads after p2 resigned: %r" % outs)
    check(wait_for(lambda: "p3" in seen, 60), "the observer saw p3")
    cands[2].send_signal(signal.SIGINT)
    cands[2].wait(60)
    obs.send_signal(signal.SIGINT)
    obs.wait(60)
    props = [l for l in seen if l in ("p1", "p2", "p3")]
    o = "\n".join(seen)
    check(props == ["p1", "p2", "p3"], "observer saw the leaders in order: %r" % o)
    k.stop()


@test
def python3_etcd3_lease_and_lock():
    k = Kvd(KVD_TEST)
    check("DONE" in check_script("etcd3lease.py", k.port), "etcd3lease.py finished")
    k.stop()


@test
def grant_rules_and_errors():
    """etcd's minimum TTL from --election-timeout, the TTL cap, duplicates,
    negative ids, unknown leases (KeepAlive TTL 0, TimeToLive -1, Revoke
    NOT_FOUND: [§20.3]), and the keep-alive stream's half-close."""
    k = Kvd(KVD_TEST, ["--election-timeout", "5000", "--heartbeat-interval", "500"])
    c = Client(k.endpoint())
    a = lcall(c, "LeaseGrant", R.LeaseGrantRequest(ID=-3, TTL=1))
    check(a[0] == "ok" and a[1].ID == -3 and a[1].TTL == 8, "min TTL ceil(1.5 x 5 s) = 8: %r" % (a,))
    a = lcall(c, "LeaseGrant", R.LeaseGrantRequest(ID=-3, TTL=100))
    check(a == ("err", "FAILED_PRECONDITION", "etcdserver: lease already exists"), "duplicate: %r" % (a,))
    a = lcall(c, "LeaseGrant", R.LeaseGrantRequest(ID=5, TTL=9000000001))
    check(a == ("err", "OUT_OF_RANGE", "etcdserver: too large lease TTL"), "too large: %r" % (a,))
    a = lcall(c, "LeaseRevoke", R.LeaseRevokeRequest(ID=77))
    check(a == ("err", "NOT_FOUND", "etcdserver: requested lease not found"), "revoke unknown: %r" % (a,))
    a = lcall(c, "LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=77))
    check(a[0] == "ok" and a[1].TTL == -1 and a[1].grantedTTL == 0, "timetolive unknown: %r" % (a,))
    f = c.ch.stream_stream("/%s/LeaseKeepAlive" % LEASE, request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=R.LeaseKeepAliveResponse.FromString)
    rs = list(f(iter([R.LeaseKeepAliveRequest(ID=-3), R.LeaseKeepAliveRequest(ID=77)]), timeout=5))
    check([(r.ID, r.TTL) for r in rs] == [(-3, 8), (77, 0)], "keep-alive answers, then the stream ends OK: %r" % rs)
    a = c.call("Put", R.PutRequest(key=b"x", value=b"y", lease=-3))
    check(a[0] == "ok", "put with a negative lease id")
    c.close()
    k.stop()
    for args, msg in ((["--election-timeout", "400"], "should be at least as 5 times as --heartbeat-interval"),
                      (["--election-timeout", "60000"], "is too long")):
        r = subprocess.run([KVD, "--data-dir", tempfile.mkdtemp(prefix="kvd-test-")] + args, capture_output=True,
                           text=True, timeout=10)
        check(r.returncode == 2 and msg in r.stderr, "%s: %d %r" % (args, r.returncode, r.stderr))


def h2load_grant(port, n, ttl):
    body = tempfile.NamedTemporaryFile(delete=False)
    body.write(grpc_frame(R.LeaseGrantRequest(TTL=ttl).SerializeToString()))
    body.close()
    r = subprocess.run(["h2load", "-n", str(n), "-c", "4", "-m", "32", "-t", "1", "-d", body.name,
                        "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "http://127.0.0.1:%d/%s/LeaseGrant" % (port, LEASE)], capture_output=True, text=True)
    os.unlink(body.name)
    return r.returncode


def count_leases(c):
    a = lcall(c, "LeaseLeases", R.LeaseLeasesRequest(), timeout=30)
    return len(a[1].leases) if a[0] == "ok" else -1


@test
def hundred_thousand_leases():
    """100k long leases plus 2000 short ones with keys, 500 of them kept
    alive: the rest expire with their keys; with nothing due kvd's CPU stays
    near idle; RSS stays bounded; a restart brings back every live lease."""
    k = Kvd(KVD)
    c = Client(k.endpoint())
    rss0 = k.rss_kb()
    t0 = time.time()
    check(h2load_grant(k.port, 100000, 600) == 0, "h2load granted")
    print("    100k LeaseGrant through h2load in %.2f s" % (time.time() - t0))
    check(count_leases(c) == 100000, "100k leases")
    stop = threading.Event()
    f = c.ch.stream_stream("/%s/LeaseKeepAlive" % LEASE, request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=R.LeaseKeepAliveResponse.FromString)

    granted = [0]

    def renewals():  # the kept leases granted so far, every 0.5 s
        while True:
            for i in range(1, min(granted[0], 500) + 1):
                yield R.LeaseKeepAliveRequest(ID=i)
            if stop.wait(0.5):
                return
    answers = []
    th = threading.Thread(target=lambda: [answers.append(r.TTL) for r in f(renewals(), timeout=300)], daemon=True)
    th.start()
    # short leases with a key each: the first 500 (TTL 5) are kept alive from
    # the moment they exist, so a slow machine granting the rest cannot let
    # them lapse; the other 1500 have TTL 2
    for base in range(1, 2001, 100):
        for i in range(base, base + 100):
            lcall(c, "LeaseGrant", R.LeaseGrantRequest(ID=i, TTL=5 if i <= 500 else 2))
            granted[0] = i
        t = R.TxnRequest()
        for i in range(base, base + 100):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"s/%04d" % i, value=b"v", lease=i))
        c.call("Txn", t)
    check(wait_for(lambda: count_leases(c) == 100500, 60, 0.2), "1500 short leases expired: %d left" %
          count_leases(c))
    keys = c.call("Range", R.RangeRequest(key=b"s/", range_end=b"s0", keys_only=True))[1].kvs
    check([kv.key for kv in keys] == [b"s/%04d" % i for i in range(1, 501)], "their keys went, the renewed stayed")
    stop.set()
    th.join(5)
    check(answers and all(t == 5 for t in answers), "keep-alive answers TTL 5")
    check(wait_for(lambda: count_leases(c) == 100000, 60, 0.2), "the renewed ones expire once renewals stop")
    check(c.call("Range", R.RangeRequest(key=b"s/", range_end=b"s0", count_only=True))[1].count == 0,
          "and their keys")
    time.sleep(0.5)
    cpu0 = k.cpu_ticks()
    time.sleep(3)
    cpu = k.cpu_ticks() - cpu0
    rss = k.rss_kb()
    hz = os.sysconf("SC_CLK_TCK")
    print("    idle with 100k leases: %d CPU ticks in 3 s (%.2f%% of a core); RSS %d KiB (+%d KiB, %d B/lease)"
          % (cpu, 100.0 * cpu / hz / 3, rss, rss - rss0, (rss - rss0) * 1024 // 100000))
    check(cpu <= 0.05 * hz * 3, "near idle when nothing is due: %d ticks" % cpu)
    check(rss - rss0 < 48 * 1024, "RSS bounded: +%d KiB" % (rss - rss0))
    c.close()
    k.stop()
    t0 = time.time()
    k2 = Kvd(KVD, data_dir=k.dir, port=k.port)
    c = Client(k2.endpoint())
    print("    restart with 100k leases: serving after %.2f s" % (time.time() - t0))
    check(count_leases(c) == 100000, "every live lease is back")
    any_id = lcall(c, "LeaseLeases", R.LeaseLeasesRequest())[1].leases[0].ID
    a = lcall(c, "LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=any_id))
    check(a[0] == "ok" and a[1].grantedTTL == 600 and 599 <= a[1].TTL <= 601,
          "full TTL again plus the election timeout, as etcd: %r" % (a,))
    c.close()
    k2.stop()


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
