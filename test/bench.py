#!/usr/bin/python3
"""kvd and Debian's etcd side by side: the same h2load calls, same bodies,
data on the same disk.  A benchmark, not a test: it prints figures and
kvd/etcd ratios (the README records them).

  test/bench.py [--n N] [--keys K] [--only transport|watch|lease|confd|kv]
  test/bench.py --only k8s [--scale S]       a control plane (kube-apiserver 1.37) on etcd 3.7.3, kine and kvd
  test/bench.py --only kv3                   Put, Range, 200k keys' RSS: etcd 3.7.3, 3.4.23 and kvd
  test/bench.py --only scale [--keys K]      K (1M) keys x 100 B: load, RSS, restart, Range, RangeStream,
                                             Snapshot, Defragment under load, HashKV; then in a 128 MiB cgroup
  test/bench.py --only rewrite [--mb 100]    Put latency during Defragment, kvd and etcd
  test/bench.py --only life                  disk writes per byte put over a simulated life
  test/bench.py --only snapshot [--keys K]   snapshot save (time, server RSS) and import of K keys x 100 B
  test/bench.py --only tls                   handshakes, Put/Range over TLS, RSS per idle TLS connection, sizes
  test/bench.py --only auth                  Authenticate/s, Put/Range with a token, RSS of 1000 users and roles
  test/bench.py --only http1                 GET /health, /metrics, gateway Range and Put over HTTP/1.1 (h2load --h1)
  test/bench.py --only embed                 in-process calls (kvd.h) beside the same calls over loopback gRPC,
                                             one instance (test/embedbench); a watch callback's cost
  test/bench.py --only flash                 write amplification (issue 53): 20000 updates of 2 KiB over 200 keys,
                                             16 writers, compacted as kube-apiserver does; etcd 3.7.3 and kvd
  test/bench.py --only replica [--n N]      kvd --replicate-from etcd 3.7.3: replication lag at 1000 Puts/s and
                                             unpaced, serializable Range, the cluster's CPU with 1000 watchers
                                             on etcd or on the replica, RSS and disk bytes per revision,
                                             catch-up after N (20000) writes made while it was down
  ... --plot FILE.svg                        also draw the table (kv3, k8s): kvd's ratio to each store per row

The confd rows compare kvd with Debian's ganeti-confd 3.0.2 instead.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Client, pb, free_port, grpc_frame, wait_for

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
R = pb()["rpc"]
DISK = "/var/tmp"
WATCHBENCH = os.path.join(ROOT, "test", "watchbench")
# what --plot FILE draws (test/lib/plot.py): the rows of the table just printed
PLOT = {"title": "", "stores": [], "rows": []}
CONFDBENCH = os.path.join(ROOT, "test", "confdbench")


class EtcdDisk:
    """etcd with its data on the same disk as kvd's (durability costs the same)."""

    def __init__(self, d=None, port=None, args=(), binary="etcd", wrap=()):
        self.port = port or free_port()
        self.dir = d or tempfile.mkdtemp(prefix="etcd-bench-", dir=DISK)
        self.url = "http://127.0.0.1:%d" % self.port
        self.t0 = time.time()
        self.p = subprocess.Popen(list(wrap) + [binary, "--name", "bench", "--data-dir", self.dir, "--listen-client-urls", self.url,
                                   "--advertise-client-urls", self.url,
                                   "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(), "--log-level", "error"]
                                  + list(args),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(20)


def proc(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def io_written(pid):
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])


def h2load(port, path, body, n, c, m, scheme="http", token=None):
    bf = tempfile.NamedTemporaryFile(delete=False)
    bf.write(body)
    bf.close()
    r = subprocess.run(["h2load", "-n", str(n), "-c", str(c), "-m", str(m), "-t", "1", "-d", bf.name,
                        "-H", "content-type: application/grpc", "-H", "te: trailers"] +
                       (["-H", "token: " + token] if token else []) + [
                        "%s://127.0.0.1:%d%s" % (scheme, port, path)], capture_output=True, text=True)
    os.unlink(bf.name)
    return h2load_rate(r.stdout)


def h2load_rate(out):
    """Requests per second from h2load's report, -1 if any failed."""
    rate, ok = 0.0, False
    for line in out.splitlines():
        if line.startswith("finished in"):
            rate = float(line.split()[3])
        if line.startswith("requests:"):
            w = line.split()
            ok = w[9] == "0" and w[11] == "0" and w[13] == "0"  # failed, errored, timeout
    return rate if ok else -1.0


def fdatasync_rate(seconds=2.0):
    """The disk's raw rate of small appends each made durable (kvd's serial put bound)."""
    fd, path = tempfile.mkstemp(dir=DISK)
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        os.write(fd, b"x" * 130)
        os.fdatasync(fd)
        n += 1
    os.close(fd)
    os.unlink(path)
    return n / (time.time() - t0)


def row(name, e, k, unit="req/s", higher=True):
    ratio = (k / e if higher else e / k) if e is not None and e > 0 and k > 0 else float("nan")
    fmt = lambda v: "-" if v is None else ("%.2f %s" if 0 <= v < 10 and v != int(v) else "%.0f %s") % (v, unit) \
        if v >= 0 else "ERR"
    print("%-46s %14s %14s %8s" % (name, fmt(e), fmt(k), "%.1fx" % ratio if ratio == ratio else "-"), flush=True)


def load(endpoint, nkeys, vsize=100):
    c = Client(endpoint)
    v = b"v" * vsize
    for base in range(0, nkeys, 128):
        t = R.TxnRequest()
        for i in range(base, min(nkeys, base + 128)):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"key-%07d" % i, value=v))
        a = c.call("Txn", t, timeout=60)
        if a[0] != "ok":
            raise RuntimeError("load failed: %r" % (a,))
    c.close()


def watchbench(port, conns, per, keys, secs, inflight):
    """Events delivered per second by test/watchbench (C: Python cannot
    count millions of events a second), from the first Put to the last event."""
    r = subprocess.run([WATCHBENCH, str(port), str(conns), str(per), str(keys), str(secs), str(inflight)],
                       capture_output=True, text=True, timeout=300)
    w = r.stdout.split()
    if r.returncode or len(w) < 8 or w[3] != w[5]:
        print("  watchbench: %s %s" % (r.stdout.strip(), r.stderr.strip()[-200:]))
        return -1.0
    return int(w[3]) / float(w[7])


def confdbench(port, keyfile, typ, query, secs, inflight):
    """Verified confd answers per second by test/confdbench (C), all status 0."""
    r = subprocess.run([CONFDBENCH, str(port), keyfile, str(typ), query, str(secs), str(inflight)],
                       capture_output=True, text=True, timeout=60)
    w = r.stdout.split()
    if r.returncode or len(w) < 12 or w[3] != w[5] or int(w[3]) == 0:
        print("  confdbench: %s %s" % (r.stdout.strip(), r.stderr.strip()[-200:]))
        return -1.0
    return int(w[3]) / float(w[11])


def confd_rows():
    """PING and CONFIG_QUERY, one and 32 outstanding: ganeti-confd and kvd
    (Ganeti mode) serve the same generated configuration; kvd's rate limits
    are lifted (one source address here), its replay cache stays on."""
    import json
    import confd
    import ganeticonf
    subprocess.run(["make", "-s", "-C", ROOT, "test/confdbench"], check=True)
    cfg = ganeticonf.build(1)
    g = confd.GanetiConfd(cfg)
    k = confd.kvd_confd(KVD, ganeti=True, args=["--confd-rate-limit", "100000000", "--confd-global-rate-limit",
                                                "100000000"])
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=confd.CFG_KEY.encode(), value=json.dumps(cfg).encode()))
    c.call("Put", R.PutRequest(key=b"cfg/wan/ip", value=b"192.0.2.1"))
    kf = os.path.join(k.key_dir, "hmac.key")
    print("%-46s %14s %14s %8s" % ("confd (UDP, verified answers)", "ganeti-confd", "kvd", "kvd/gnt"))
    cpu = {}
    for name, typ, q in (("PING", 0, "-"), ("CONFIG_QUERY cluster_name", 10, '"/cluster/cluster_name"')):
        for inflight in (1, 32):
            rates = []
            for side, port in ((g, g.port), (k, k.confd_port)):
                t0 = cpu_ticks(side.p.pid)
                rates.append(confdbench(port, kf, typ, q, 3, inflight))
                cpu.setdefault((name, inflight), []).append(
                    (cpu_ticks(side.p.pid) - t0) * 1e6 / os.sysconf("SC_CLK_TCK") / max(rates[-1] * 3, 1))
            row("%s, %d outstanding" % (name, inflight), rates[0], rates[1], "q/s")
    for (name, inflight), (ce, ck) in cpu.items():
        row("  server CPU per %s, %d outstanding" % (name.split()[0], inflight), ce, ck, "us", higher=False)
    row("RSS serving the configuration", proc(g.p.pid, "VmRSS"), proc(k.p.pid, "VmRSS"), "KiB", higher=False)
    k.stop()
    k = confd.kvd_confd(KVD, args=["--confd-rate-limit", "100000000", "--confd-global-rate-limit", "100000000"])
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"cfg/wan/ip", value=b"192.0.2.1"))
    for inflight in (1, 32):
        row("keyspace CONFIG_QUERY a key, %d outstanding" % inflight, None,
            confdbench(k.confd_port, os.path.join(k.key_dir, "hmac.key"), 10, '"cfg/wan/ip"', 3, inflight), "q/s")
    k.stop()
    g.stop()


def idle_watchers(srv, port, conns, per):
    """RSS bytes per idle watcher: conns streams of per watchers each."""
    before = proc(srv.p.pid, "VmRSS")
    p = subprocess.Popen([WATCHBENCH, str(port), str(conns), str(per), str(conns * per), "30", "0"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    time.sleep(2)
    after = proc(srv.p.pid, "VmRSS")
    p.kill()
    p.wait()
    return (after - before) * 1024.0 / (conns * per) if line.startswith("created") else -1.0


def first_answer(start, endpoint):
    """Seconds from exec to the first answered Range (a fresh channel per try:
    grpc's reconnect backoff would otherwise dominate)."""
    import socket
    host, port = endpoint.split(":")
    t0 = time.time()
    p = start()
    while time.time() - t0 < 120:
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
        except OSError:
            time.sleep(0.002)
            continue
        c = Client(endpoint)
        ok = c.call("Range", R.RangeRequest(key=b"key-0000001"), timeout=1)[0] == "ok"
        c.close()
        if ok:
            break
    return time.time() - t0, p


def serial_puts(endpoint, until, key=b"lat", lat=None):
    """Put latencies (s) of one client putting one key after another until
    until() says stop (appended to lat as they come, if given)."""
    c = Client(endpoint)
    lat = [] if lat is None else lat
    while not until() or not lat:
        t0 = time.time()
        c.call("Put", R.PutRequest(key=key, value=b"x" * 100), timeout=60)
        lat.append(time.time() - t0)
    c.close()
    return lat


def pcts(lat):
    s = sorted(lat)
    return s[len(s) // 2] * 1000, s[min(len(s) - 1, int(len(s) * 0.99))] * 1000, s[-1] * 1000


def rewrite_rows(mb=100):
    """Put latency while 'mb' MB of log (half of it history a compaction
    dropped) is rewritten by Defragment, against none; etcd's defragment of
    the same data beside it."""
    ke = Kvd(KVD, ["--auto-rewrite=false", "--quota-backend-bytes", str(8 << 30)],
             data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    ee = EtcdDisk()
    wait_for(lambda: Client(ee.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    subprocess.run(["etcdctl", "--endpoints", ee.endpoint(), "put", "x", "y"], capture_output=True)
    res = {}
    for name, srv in (("etcd", ee), ("kvd", ke)):
        c = Client(srv.endpoint())
        n = mb * 1024 // 2  # keys of 1 KiB, written twice
        for rnd in range(2):
            for base in range(0, n, 100):
                t = R.TxnRequest()
                for i in range(base, min(n, base + 100)):
                    t.success.add().request_put.CopyFrom(R.PutRequest(key=b"key-%07d" % i, value=bytes([97 + rnd]) * 1024))
                c.call("Txn", t, timeout=60)
        rev = c.call("Range", R.RangeRequest(key=b"x"))[1].header.revision
        c.call("Compact", R.CompactionRequest(revision=rev, physical=True), timeout=300)
        size = c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")[1].dbSize
        t_end = time.time() + 3
        idle = serial_puts(srv.endpoint(), lambda: time.time() > t_end)
        done = threading.Event()
        took = []

        def run():
            t0 = time.time()
            a = c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                       resp="DefragmentResponse", timeout=600)
            took.append((time.time() - t0, a[0]))
            done.set()
        th = threading.Thread(target=run)
        w0 = io_written(srv.p.pid)
        th.start()
        during = serial_puts(srv.endpoint(), done.is_set)
        th.join()
        wrote = io_written(srv.p.pid) - w0
        after = c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")[1].dbSize
        res[name] = (idle, during, took[0], size, after, wrote)
        c.close()
        srv.stop()
    print("Defragment of a %d MB store (half of it compacted history), serial 100-byte Puts meanwhile:" % mb)
    for name in ("etcd", "kvd"):
        idle, during, (secs, ok), size, after, wrote = res[name]
        print("  %-5s db %6.1f -> %5.1f MB in %5.2f s (%s), %.2f bytes written per byte kept; Put p50/p99/max ms: "
              "idle %.2f/%.2f/%.1f, during %.2f/%.2f/%.1f (%d puts)" %
              ((name, size / 1e6, after / 1e6, secs, ok, wrote / max(after, 1)) + pcts(idle) + pcts(during) +
               (len(during),)))


def life_rows(writes=1000000, nkeys=1000):
    """A simulated life: writes overwrites of nkeys keys (100-byte values) in
    txns of 100, periodic auto-compaction keeping 1 s on both, kvd's automatic
    rewrite on (etcd has no such thing); bytes the disk got per byte put, and
    the data dir at the end."""
    ke = Kvd(KVD, ["--auto-compaction-retention", "1s"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    ee = EtcdDisk(args=["--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1s"])
    wait_for(lambda: Client(ee.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    out = {}
    for name, srv in (("etcd", ee), ("kvd", ke)):
        c = Client(srv.endpoint())
        w0 = io_written(srv.p.pid)
        user = 0
        t0 = time.time()
        for base in range(0, writes, 100):
            t = R.TxnRequest()
            for i in range(base, base + 100):
                t.success.add().request_put.CopyFrom(R.PutRequest(key=b"k%05d" % (i % nkeys), value=b"%0100d" % i))
                user += 6 + 100
            c.call("Txn", t, timeout=60)
        secs = time.time() - t0
        time.sleep(3)  # the compactors (and kvd's rewrite) catch up with the last writes
        wrote = io_written(srv.p.pid) - w0
        du = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(srv.dir) for f in fs)
        out[name] = (wrote / user, du, secs)
        c.close()
        srv.stop()
    print("A life of %d overwrites of %d keys (periodic compaction keeping 1 s on both):" % (writes, nkeys))
    row("  disk bytes written per byte put", out["etcd"][0], out["kvd"][0], "B", higher=False)
    row("  data dir at the end", out["etcd"][1], out["kvd"][1], "B", higher=False)


def metric_sum(port, name, labels=""):
    """One sample of /metrics on port (0 when absent)."""
    import http.client
    import re
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), body, re.M)
    return float(m.group(1)) if m else 0.0


def flash_rows(updates=20000, nkeys=200, vsize=2048, writers=16, every=2000, keep=1000):
    """Issue 53's write amplification: updates of vsize-byte values over
    nkeys keys by concurrent writers, compacted every `every` revisions
    keeping `keep` (as kube-apiserver compacts), on etcd 3.7.3 and kvd:
    bytes handed to the block layer (/proc/PID/io write_bytes) per byte of
    keys and values changed; fdatasyncs; the data file's largest size
    against what readers can still see (Status' dbSizeInUse); kvd's own
    breakdown from /metrics."""
    from kvdtest import go_peer
    e37 = go_peer("etcd")
    if not e37:
        print("SKIPPED: needs the etcd 3.7.3 peer (test/lib/deps.sh test)")
        return
    servers = [("etcd 3.7.3", EtcdDisk(binary=e37)),
               ("kvd", Kvd(KVD, ["--name", "bench"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)))]
    out = {}
    for name, srv in servers:
        wait_for(lambda: Client(srv.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
        st = lambda c: c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")
        sync_name = "etcd_disk_wal_fsync_duration_seconds_count"
        m0 = metric_sum(srv.port, sync_name) + metric_sum(srv.port, "etcd_disk_backend_commit_duration_seconds_count")
        k0 = {w: metric_sum(srv.port, "kvd_disk_written_bytes_total", '{writer="%s"}' % w)
              for w in ("log", "rewrite", "reserve")}
        p0 = metric_sum(srv.port, "kvd_log_payload_bytes_total")
        s0 = {w: metric_sum(srv.port, "kvd_disk_syncs_total", '{writer="%s"}' % w) for w in ("log", "rewrite", "reserve")}
        w0 = io_written(srv.p.pid)
        left = [updates]
        lock = threading.Lock()
        payload = [0]
        peak = [0.0, 0, 0]  # ratio, file bytes, in use
        done = threading.Event()

        def writer(i):
            c = Client(srv.endpoint())
            while True:
                with lock:
                    if left[0] <= 0:
                        break
                    left[0] -= 1
                    n = left[0]
                key = b"flash/%04d" % (n % nkeys)
                val = (b"%08d" % n) * (vsize // 8)
                r = c.call("Put", R.PutRequest(key=key, value=val), timeout=60)
                if r[0] == "ok":
                    with lock:
                        payload[0] += len(key) + len(val)
                    rev = r[1].header.revision
                    if rev % every == 0:
                        c.call("Compact", R.CompactionRequest(revision=rev - keep), timeout=60)
            c.close()

        def sampler():
            c = Client(srv.endpoint())
            while not done.is_set():
                r = st(c)
                if r[0] == "ok" and r[1].dbSizeInUse:
                    ratio = r[1].dbSize / r[1].dbSizeInUse
                    if ratio > peak[0]:
                        peak[:] = [ratio, r[1].dbSize, r[1].dbSizeInUse]
                time.sleep(0.05)
            c.close()
        sm = threading.Thread(target=sampler)
        sm.start()
        ths = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
        t0 = time.time()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        secs = time.time() - t0
        time.sleep(2)  # a rewrite or a compaction's last writes
        done.set()
        sm.join()
        wrote = io_written(srv.p.pid) - w0
        syncs = metric_sum(srv.port, sync_name) + metric_sum(srv.port, "etcd_disk_backend_commit_duration_seconds_count") - m0
        if name == "kvd":  # kvd's wal and backend counts are the same syncs: its own count, by writer
            syncs = sum(metric_sum(srv.port, "kvd_disk_syncs_total", '{writer="%s"}' % w) - s0[w] for w in s0)
        kb = {w: metric_sum(srv.port, "kvd_disk_written_bytes_total", '{writer="%s"}' % w) - k0[w] for w in k0}
        kp = metric_sum(srv.port, "kvd_log_payload_bytes_total") - p0
        out[name] = dict(wa=wrote / max(payload[0], 1), wrote=wrote, payload=payload[0], syncs=syncs, secs=secs,
                         peak=peak, kb=kb, kp=kp)
        srv.stop()
    print("%d updates of %d B values over %d keys, %d writers, compacted every %d revisions keeping %d; data on %s" %
          (updates, vsize, nkeys, writers, every, keep, DISK))
    print("%-46s %14s %14s %8s" % ("", "etcd 3.7.3", "kvd", "kvd/etcd"))
    e, k = out["etcd 3.7.3"], out["kvd"]
    row("write amplification (block layer / changed)", e["wa"], k["wa"], "x", higher=False)
    row("bytes written", e["wrote"], k["wrote"], "B", higher=False)
    row("fdatasyncs (etcd: WAL + backend commits)", e["syncs"], k["syncs"], "", higher=False)
    row("data file / in use, at its largest", e["peak"][0], k["peak"][0], "x", higher=False)
    row("updates/s", updates / e["secs"], updates / k["secs"], "/s")
    kb, kp = k["kb"], k["kp"]
    print("kvd's bytes, per byte of keys and values changed (%d B):" % k["payload"])
    for what, v in (("log: keys and values", kp), ("log: framing (record and op headers)", kb["log"] - kp),
                    ("rewrite: live data copied", kb["rewrite"]), ("reserve file", kb["reserve"]),
                    ("block layer beyond kvd's writes (pages written again, metadata)",
                     k["wrote"] - kb["log"] - kb["rewrite"] - kb["reserve"])):
        print("  %-62s %12d B %7.3f" % (what, v, v / max(k["payload"], 1)))


def paced_writer(argv):
    """bench.py --writer ENDPOINT RATE SECS COUNT INFLIGHT (internal): Puts of
    small values to keys wk/0000..wk/0999 round-robin, RATE a second (0: as
    fast as INFLIGHT calls in flight allow) until SECS pass or COUNT are
    answered (0: no limit).  A process of its own, so that the bench's
    watchers do not share its interpreter.  Prints "puts N secs S rev R"
    (R: the highest revision answered)."""
    import collections
    import grpc
    endpoint, rate, secs, count, inflight = argv[0], float(argv[1]), float(argv[2]), int(argv[3]), int(argv[4])
    ch = grpc.insecure_channel(endpoint)
    f = ch.unary_unary("/etcdserverpb.KV/Put", request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=R.PutResponse.FromString)
    out = collections.deque()
    done, rev, i = 0, 0, 0
    t0 = time.monotonic()
    while (not secs or time.monotonic() - t0 < secs) and (not count or i < count):
        if rate:
            due = t0 + i / rate
            if due > time.monotonic():
                time.sleep(max(0.0, due - time.monotonic()))
        out.append(f.future(R.PutRequest(key=b"wk/%04d" % (i % 1000), value=b"v%08d" % i), timeout=60))
        i += 1
        while len(out) >= inflight or (out and out[0].done()):
            rev = max(rev, out.popleft().result().header.revision)
            done += 1
    while out:
        rev = max(rev, out.popleft().result().header.revision)
        done += 1
    print("puts %d secs %.6f rev %d" % (done, time.monotonic() - t0, rev), flush=True)
    ch.close()
    return 0


def write_load(endpoint, rate, secs, count=0, inflight=64):
    """paced_writer in a process of its own: (puts, seconds, last revision)."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--writer", endpoint, str(rate), str(secs),
                        str(count), str(inflight)], capture_output=True, text=True, timeout=600)
    w = r.stdout.split()
    if r.returncode or len(w) < 6:
        raise RuntimeError("writer: %s %s" % (r.stdout.strip(), r.stderr.strip()[-300:]))
    return int(w[1]), float(w[3]), int(w[5])


class StampedWatches:
    """Watches of keys wk/ from one revision, one raw HTTP/2 connection each
    (kvdtest.H2), read by one thread that stamps each revision's first
    event with time.monotonic() as its bytes are read: no grpc threads
    between the socket and the clock.  .at[i]: revision -> time, watch i."""

    def __init__(self, ports, start):
        import struct
        from kvdtest import H2, frame, DATA, HEADERS, WINDOW_UPDATE
        self.conns = []
        for port in ports:
            h = H2(port, init_window=(1 << 31) - 1)
            req = R.WatchRequest(create_request=R.WatchCreateRequest(key=b"wk/", range_end=b"wk0",
                                                                      start_revision=start))
            h.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)) +
                   frame(HEADERS, 4, 1, h.block("/etcdserverpb.Watch/Watch")) +
                   frame(DATA, 0, 1, grpc_frame(req.SerializeToString())))
            h.s.setblocking(False)
            self.conns.append(h)
        self.at = [{} for _ in ports]
        self.created = [False] * len(ports)
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        import select
        import struct
        from kvdtest import frame, DATA, SETTINGS, PING
        msgs = [b""] * len(self.conns)
        bufs = [b""] * len(self.conns)
        while not self.stop.is_set():
            ready, _, _ = select.select([h.s for h in self.conns], [], [], 0.05)
            for i, h in enumerate(self.conns):
                if h.s not in ready:
                    continue
                now = time.monotonic()
                try:
                    d = h.s.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not d:
                    self.stop.set()
                    break
                b, at, data = bufs[i] + d, 0, []
                while len(b) - at >= 9:
                    ln = int.from_bytes(b[at:at + 3], "big")
                    if len(b) - at < 9 + ln:
                        break
                    ftype, flags = b[at + 3], b[at + 4]
                    sid = struct.unpack(">I", b[at + 5:at + 9])[0] & 0x7FFFFFFF
                    payload, at = b[at + 9:at + 9 + ln], at + 9 + ln
                    if ftype == DATA and sid == 1:
                        data.append(payload)
                    elif ftype == SETTINGS and not flags & 1:
                        h.s.sendall(frame(SETTINGS, 1, 0))
                    elif ftype == PING and not flags & 1:
                        h.s.sendall(frame(PING, 1, 0, payload))
                bufs[i] = b[at:]
                m, at = msgs[i] + b"".join(data), 0
                while len(m) - at >= 5 and len(m) - at >= 5 + int.from_bytes(m[at + 1:at + 5], "big"):
                    ln = int.from_bytes(m[at + 1:at + 5], "big")
                    r = R.WatchResponse.FromString(m[at + 5:at + 5 + ln])
                    at += 5 + ln
                    self.created[i] = self.created[i] or r.created
                    for ev in r.events:
                        self.at[i].setdefault(ev.kv.mod_revision, now)
                msgs[i] = m[at:]

    def seen(self, i):
        return max(self.at[i]) if self.at[i] else 0

    def close(self):
        self.stop.set()
        self.th.join()
        for h in self.conns:
            h.close()


def replica_rows(ncatch=20000, n=100000):
    """Issue 52's replica figures in one run: etcd 3.7.3 (test/peers) and kvd
    --replicate-from it, data on the same disk.  Replication lag (a watcher
    on each, both from the same revision, in this process: the replica's
    arrival time of each revision less etcd's) under a paced writer at 1000
    Puts/s and an unpaced one; serializable and linearizable Range, h2load
    on both; the cluster's CPU with 1000 watchers (test/watchbench, one
    per key, each Put one event) on etcd, then on the replica; the replica's
    RSS and disk bytes per upstream revision; catch-up after ncatch writes
    made while it was stopped, against the time etcd took to take them and
    the time etcd takes to send them to a fresh watcher from the same
    revision (etcd sends an unsynced watcher 1000 revisions a cycle, one
    cycle every 100 ms or so: no follower of etcd catches up faster).
    Noise: a second watcher on etcd beside the first says what the
    measurement itself adds to the lag (the same one thread stamps all)."""
    from kvdtest import go_peer
    e37 = go_peer("etcd")
    if not e37:
        print("SKIPPED: needs the etcd 3.7.3 peer (test/lib/deps.sh test)")
        return
    subprocess.run(["make", "-s", "-C", ROOT, "test/watchbench"], check=True)
    e = EtcdDisk(binary=e37)
    try:
        replica_figures(e, ncatch, n)
    finally:
        if e.p.poll() is None:
            e.stop()
        os.system("rm -rf %s" % e.dir)


def replica_figures(e, ncatch, n):
    """replica_rows' figures, etcd e started."""
    hz = os.sysconf("SC_CLK_TCK")
    ec = Client(e.endpoint())
    wait_for(lambda: ec.call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
    ec.call("Put", R.PutRequest(key=b"x", value=b"y"))
    kvd_dir = tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)
    kargs = ["--name", "bench", "--replicate-from", e.url]
    k = Kvd(KVD, kargs, data_dir=kvd_dir)
    kc = Client(k.endpoint())

    def revision(c):
        r = c.call("Range", R.RangeRequest(key=b"\0", count_only=True, serializable=True))
        return r[1].header.revision if r[0] == "ok" else -1

    def caught_up(timeout=60):
        want = revision(ec)
        if not wait_for(lambda: revision(kc) == want, timeout, 0.005):
            raise RuntimeError("the replica is at %d, etcd at %d" % (revision(kc), want))
        return want
    caught_up()
    print("kvd --replicate-from etcd 3.7.3 (test/peers), %d CPUs, data on %s; writers: Puts of 9 B over 1000 keys" %
          (os.cpu_count(), DISK))

    def lag(rate, secs, inflight):
        start = caught_up() + 1
        ws = StampedWatches([e.port, e.port, k.port], start)  # the second on etcd: the measurement's own noise
        if not wait_for(lambda: all(ws.created), 30, 0.005):
            raise RuntimeError("a watch was not created")
        puts, took, last = write_load(e.endpoint(), rate, secs, inflight=inflight)
        if not wait_for(lambda: all(ws.seen(i) >= last for i in range(3)), 60, 0.01):
            raise RuntimeError("watchers at %s, want %d" % ([ws.seen(i) for i in range(3)], last))
        ws.close()
        at = ws.at
        lags = [at[2][r] - at[0][r] for r in range(start, last + 1) if r in at[0] and r in at[2]]
        noise = [at[1][r] - at[0][r] for r in range(start, last + 1) if r in at[0] and r in at[1]]
        missing = (last + 1 - start) - len(lags)
        return puts / took, pcts(lags), pcts(noise), missing

    def disk(srv):
        return io_written(srv.p.pid)

    def kvd_metric(name):
        return sum(metric_sum(k.port, name, '{writer="%s"}' % w) for w in ("log", "rewrite", "reserve"))

    def lag_rows(what, run):
        rate, (p50, p99, mx), noise, missing = run
        print("%-46s %14s %14s %14s" % (what % rate, "%.2f ms" % p50, "%.2f ms" % p99, "%.2f ms" % mx) +
              ("  %d revisions unseen" % missing if missing else ""))
        print("%-46s %14s %14s %14s" % ("    two watchers on etcd (this process's noise)", "%.2f ms" % noise[0],
                                        "%.2f ms" % noise[1], "%.2f ms" % noise[2]), flush=True)
        return rate, p99
    print("%-46s %14s %14s %14s" % ("replication lag (replica - etcd, per revision)", "p50", "p99", "max"))
    r0, w0, s0, we0, wk0 = revision(kc), kvd_metric("kvd_disk_written_bytes_total"), \
        kvd_metric("kvd_disk_syncs_total"), disk(e), disk(k)
    rate, p99 = lag_rows("  at %.0f writes/s (paced 1000/s, 10 s)", lag(1000, 10, 64))
    revs = max(revision(kc) - r0, 1)
    per = ((kvd_metric("kvd_disk_written_bytes_total") - w0) / revs, (disk(e) - we0) / revs, (disk(k) - wk0) / revs,
           (kvd_metric("kvd_disk_syncs_total") - s0) / revs)
    print("  goal p99 < 10 ms at 1000 writes/s: %s" % ("met" if p99 < 10 and rate > 950 else "NOT met"))
    lag_rows("  at %.0f writes/s (unpaced, 32 in flight, 5 s)", lag(0, 5, 32))
    print("%-46s %14s %14s %8s" % ("", "etcd", "replica", "kvd/etcd"))
    srng = grpc_frame(R.RangeRequest(key=b"wk/0001", serializable=True).SerializeToString())
    rng = grpc_frame(R.RangeRequest(key=b"wk/0001").SerializeToString())
    for name, body in (("Range serializable", srng), ("Range linearizable", rng)):
        row("%s -c 16 -m 8" % name, h2load(e.port, "/etcdserverpb.KV/Range", body, n, 16, 8),
            h2load(k.port, "/etcdserverpb.KV/Range", body, n, 16, 8))
    row("RSS following 1000 keys", proc(e.p.pid, "VmRSS"), proc(k.p.pid, "VmRSS"), "KiB", higher=False)
    row("disk bytes per revision at 1000/s (block layer)", per[1], per[2], "B", higher=False)
    print("%-46s %14s %14s" % ("  kvd's own writes per revision (/metrics)", "", "%.0f B" % per[0]))
    print("%-46s %14s %14s" % ("  kvd's fdatasyncs per revision (/metrics)", "", "%.2f" % per[3]), flush=True)

    def cpu_run(where):
        """1000 watchers (watchbench: 10 streams x 100, one key each) on
        where, 10 s of 1000 Puts/s on etcd: CPU seconds of etcd and kvd."""
        if where:
            wb = subprocess.Popen([WATCHBENCH, str(where.port), "10", "100", "1000", "120", "0"],
                                  stdout=subprocess.PIPE, text=True)
            line = wb.stdout.readline()
            if not line.startswith("created"):
                raise RuntimeError("watchbench: %r" % line)
        alive = k.alive()
        te, tk = cpu_ticks(e.p.pid), cpu_ticks(k.p.pid) if alive else 0
        write_load(e.endpoint(), 1000, 10, inflight=64)
        if alive:
            caught_up()  # the replica's watchers have what the writer wrote
        out = ((cpu_ticks(e.p.pid) - te) / hz, (cpu_ticks(k.p.pid) - tk) / hz if alive else None)
        if where:
            wb.kill()
            wb.wait()
        return out
    eb, kb = cpu_run(k)
    # catch-up: the replica stopped where it was (etcd's revision), ncatch Puts, then it starts on its store
    base = caught_up()
    k.stop()
    puts, took, last = write_load(e.endpoint(), 0, 0, count=ncatch, inflight=32)
    t0 = time.monotonic()  # etcd's own pace serving an old start revision: a fresh watcher's catch-up
    ws = StampedWatches([e.port], base + 1)
    fresh = wait_for(lambda: ws.seen(0) >= last, 120, 0.002)
    fresh = ws.seen(0) >= last and time.monotonic() - t0
    ws.close()
    t0 = time.time()
    k = Kvd(KVD, kargs, data_dir=kvd_dir, port=k.port, wait=False)

    def listening():
        try:
            socket.create_connection(("127.0.0.1", k.port), timeout=0.2).close()
            return True
        except OSError:
            return not k.alive()
    wait_for(listening, 60, 0.002)  # a channel made before would sit in grpc's reconnect backoff
    t1 = time.time()
    kc.close()
    kc = Client(k.endpoint())
    ok = wait_for(lambda: revision(kc) >= last or not k.alive(), 120, 0.002) and k.alive()
    secs = time.time() - t0
    syncs = kvd_metric("kvd_disk_syncs_total")  # kvd's counters start again at 0
    kcpu = cpu_ticks(k.p.pid) / hz
    resumed = "resuming from the store's revision %d" % base in k.logtext()
    kc.close()
    k.stop()
    # the same writes and watchers without the replica: on etcd, then none
    ea, _ = cpu_run(e)
    e0, _ = cpu_run(None)
    print("%-46s %14s %14s %8s" % ("CPU, 1000 watchers, 10 s of 1000 Puts/s", "on etcd", "on replica", "ratio"))
    row("  etcd", ea, eb, "s", higher=False)
    row("  kvd (the replica)", None, kb, "s", higher=False)
    row("  both", ea, eb + kb, "s", higher=False)
    print("%-46s %14s" % ("  etcd, the same Puts, no watchers, no replica", "%.2f s" % e0))
    print("  (test/watchbench: 10 streams x 100 watchers, one key each, so each Put is one event)", flush=True)
    print("catch-up: %d revisions (%d -> %d) written while the replica was down" % (last - base, base, last))
    row("  etcd taking them (32 in flight) / the replica", took * 1000, secs * 1000 if ok else -1, "ms",
        higher=False)
    print("  goal: the replica catches up faster than the cluster wrote: %s" % ("met" if ok and secs < took else
                                                                               "NOT met"))
    print("  a fresh watcher on etcd from revision %d: all of them in %s" %
          (base + 1, "%.0f ms" % (fresh * 1000) if fresh else "ERR (not within 120 s)"))
    print("  the replica: %.0f ms from exec to listening, then %.0f revisions/s; %.2f fdatasyncs per revision; "
          "%.2f s CPU" % ((t1 - t0) * 1000, (last - base) / max(secs - (t1 - t0), 1e-9), syncs / max(last - base, 1),
                          kcpu), flush=True)
    if not resumed:
        print("  (the replica's log does not say it resumed from %d: %s)" % (base, k.logtext()[-300:]))
    ec.close()
    os.system("rm -rf %s" % kvd_dir)


def snapshot_rows(nkeys=200000):
    """etcdctl snapshot save of nkeys x 100 B from each server: time, file,
    the server's RSS before and at its peak during the save; then kvd's
    import (--restore-snapshot) of each file, to the first answer."""
    ke = Kvd(KVD, data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    ee = EtcdDisk()
    wait_for(lambda: Client(ee.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    out, files = {}, {}
    for name, srv in (("etcd", ee), ("kvd", ke)):
        load(srv.endpoint(), nkeys)
        c = Client(srv.endpoint())
        c.call("Range", R.RangeRequest(key=b"key-", range_end=b"key.", count_only=True), timeout=60)
        c.close()
        rss0 = proc(srv.p.pid, "VmRSS")
        peak = [rss0]
        done = threading.Event()

        def sample(pid=srv.p.pid):
            while not done.is_set():
                peak[0] = max(peak[0], proc(pid, "VmRSS"))
                time.sleep(0.005)
        th = threading.Thread(target=sample)
        th.start()
        f = os.path.join(DISK, "kvd-bench-%s-%d.db" % (name, os.getpid()))
        t0 = time.time()
        r = subprocess.run(["etcdctl", "--endpoints", srv.endpoint(), "snapshot", "save", f], capture_output=True,
                           env=dict(os.environ, ETCDCTL_API="3"))
        secs = time.time() - t0
        done.set()
        th.join()
        if r.returncode:
            raise RuntimeError("snapshot save from %s: %s" % (name, r.stderr[-300:]))
        out[name] = (secs, os.path.getsize(f), rss0, peak[0])
        if name == "kvd":
            wait_for(lambda: "planned in" in srv.logtext(), 10)
            print("  kvd: %s" % [l for l in srv.logtext().splitlines() if "planned in" in l][-1].split("kvd: ")[-1])
        files[name] = f
        srv.stop()
    print("etcdctl snapshot save of %d keys x 100 B:" % nkeys)
    row("  time", out["etcd"][0] * 1000, out["kvd"][0] * 1000, "ms", higher=False)
    row("  file", out["etcd"][1], out["kvd"][1], "B", higher=False)
    row("  server RSS before", out["etcd"][2], out["kvd"][2], "KiB", higher=False)
    row("  server RSS peak during the save", out["etcd"][3], out["kvd"][3], "KiB", higher=False)
    for name in ("etcd", "kvd"):
        d = tempfile.mkdtemp(prefix="kvd-bench-imp-", dir=DISK)
        t0 = time.time()
        k = Kvd(KVD, ["--restore-snapshot", files[name]], data_dir=d)
        Client(k.endpoint()).call("Range", R.RangeRequest(key=b"x"))
        secs = time.time() - t0
        line = [l for l in k.logtext().splitlines() if "imported" in l]
        print("  kvd --restore-snapshot of %s's file: %.0f ms to the first answer, RSS %d KiB (%s)" %
              (name, secs * 1000, proc(k.p.pid, "VmRSS"), line[0].split("kvd: ")[-1] if line else "?"))
        k.stop()
        subprocess.run(["rm", "-rf", d, files[name]])


def tls_rows(n=100000):
    """kvd and etcd with the same ECDSA P-256 certificate: handshakes per
    second (h2load, one call per connection), durable Put and Range over TLS,
    RSS per idle TLS connection (256, HTTP/2 preface sent), binary sizes."""
    import ssl
    d = tempfile.mkdtemp(prefix="kvd-bench-tls-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "3", "-subj", "/CN=bench",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    tls = ["--cert-file", d + "/c.pem", "--key-file", d + "/k.pem"]
    ep, kp = free_port(), free_port()
    e = EtcdDisk(port=ep, args=tls + ["--listen-client-urls", "https://127.0.0.1:%d" % ep,
                                       "--advertise-client-urls", "https://127.0.0.1:%d" % ep])
    k = Kvd(KVD, tls + ["--listen-client-urls", "https://127.0.0.1:%d" % kp, "--max-connections-per-ip", "0"],
            data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))

    def tls_up(port):
        try:
            ctx = ssl.create_default_context(cafile=d + "/c.pem")
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=2),
                                 server_hostname="127.0.0.1"):
                return True
        except OSError:
            return False
    wait_for(lambda: tls_up(ep) and tls_up(kp), 60)
    empty = grpc_frame(b"")
    put = grpc_frame(R.PutRequest(key=b"tls-key", value=b"v" * 100).SerializeToString())
    rng = grpc_frame(R.RangeRequest(key=b"tls-key").SerializeToString())
    print("over TLS (ECDSA P-256 certificate, TLS 1.2 on both; h2load -t 1):")

    def idle(pid, port, count=256):
        ctx = ssl.create_default_context(cafile=d + "/c.pem")
        ctx.set_alpn_protocols(["h2"])
        r0 = proc(pid, "VmRSS")
        socks = []
        for _ in range(count):
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            s.recv(9)  # the server's SETTINGS: it has taken the connection as HTTP/2
            socks.append(s)
        r1 = proc(pid, "VmRSS")
        for s in socks:
            s.close()
        return (r1 - r0) * 1024 / count
    row("  RSS per idle TLS connection (256, first thing)", idle(e.p.pid, ep), idle(k.p.pid, kp), "B",
        higher=False)

    def handshakes(port):
        r = subprocess.run(["openssl", "s_time", "-connect", "127.0.0.1:%d" % port, "-new", "-time", "3"],
                           capture_output=True, text=True)
        for line in r.stdout.splitlines():
            if "connections in" in line and "real seconds" in line:
                w = line.split()
                return float(w[0]) / float(w[3])
        return -1.0
    row("  TLS handshakes (openssl s_time -new, one client)", handshakes(ep), handshakes(kp))
    for name, path, body in (("Put, durable", "/etcdserverpb.KV/Put", put), ("Range", "/etcdserverpb.KV/Range", rng)):
        row("  %s -c 16 -m 8" % name, h2load(ep, path, body, n, 16, 8, "https"),
            h2load(kp, path, body, n, 16, 8, "https"))
    e.stop()
    k.stop()
    sizes = {}
    for tls_on in (1, 0):
        for static in (0, 1):
            out = os.path.join(d, "kvd-%d-%d" % (tls_on, static))
            cmd = ["cc", "-O2", "-std=c99", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections", "-s",
                   "-o", out, os.path.join(ROOT, "kvd.c")] + (["-static"] if static else []) + \
                  (["-lprotobuf-c", "-lmbedtls", "-lmbedx509", "-lmbedcrypto"] if tls_on else
                   ["-DKVD_NO_TLS", "-lprotobuf-c", "-lmbedcrypto"])
            subprocess.run(cmd, check=True, capture_output=True)
            sizes[(tls_on, static)] = os.path.getsize(out)
    print("  kvd stripped, -O2: dynamic %d B with TLS, %d B without; static (glibc) %d B with TLS, %d B without" %
          (sizes[(1, 0)], sizes[(0, 0)], sizes[(1, 1)], sizes[(0, 1)]))
    subprocess.run(["rm", "-rf", d])


def auth_rows(n=100000):
    """Auth on in both (bcrypt cost 10, etcd's default): Authenticate per
    second, Range and durable Put with a token (h2load, the same bodies);
    then RSS growth for 1000 users, 1000 roles and 10k permissions (cost 4,
    the hashes' cost is not what is measured)."""
    import auth as A
    ep = EtcdDisk()
    k = Kvd(KVD, [], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    wait_for(lambda: Client(ep.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    print("auth on (simple tokens, bcrypt cost 10; h2load -t 1):")
    toks = []
    for s in (ep, k):
        p = A.Peer(s.endpoint())
        A.setup_alice(p)
        p.call("Put", R.PutRequest(key=b"/app/k", value=b"v" * 100), p.tok["alice"])
        toks.append(p.tok["alice"])
        p.close()
    body = grpc_frame(R.AuthenticateRequest(name="alice", password="apw").SerializeToString())
    row("  Authenticate -c 16 -m 1 (one hash each)",
        h2load(ep.port, "/etcdserverpb.Auth/Authenticate", body, 200, 16, 1),
        h2load(k.port, "/etcdserverpb.Auth/Authenticate", body, 200, 16, 1))
    put = grpc_frame(R.PutRequest(key=b"/app/k", value=b"v" * 100).SerializeToString())
    rng = grpc_frame(R.RangeRequest(key=b"/app/k").SerializeToString())
    for name, path, b in (("Put, durable, with a token", "/etcdserverpb.KV/Put", put),
                          ("Range with a token", "/etcdserverpb.KV/Range", rng)):
        row("  %s -c 16 -m 8" % name, h2load(ep.port, path, b, n, 16, 8, token=toks[0]),
            h2load(k.port, path, b, n, 16, 8, token=toks[1]))
    ep.stop()
    k.stop()
    ep = EtcdDisk(args=["--bcrypt-cost", "4"])
    k = Kvd(KVD, ["--bcrypt-cost", "4"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    wait_for(lambda: Client(ep.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    grow = []
    for s in (ep, k):
        p = A.Peer(s.endpoint())
        r0 = proc(s.p.pid, "VmRSS")
        for i in range(1000):
            p.call("RoleAdd", R.AuthRoleAddRequest(name="role-%04d" % i))
            for j in range(10):
                key = b"/tenant/%04d/%02d/" % (i, j)
                p.call("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(
                    name="role-%04d" % i, perm=A.AUTHPB.Permission(permType=j % 3, key=key, range_end=key[:-1] + b"0")))
            p.call("UserAdd", R.AuthUserAddRequest(name="user-%04d" % i, password="pw-%d" % i))
            p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="user-%04d" % i, role="role-%04d" % i))
        grow.append(proc(s.p.pid, "VmRSS") - r0)
        p.close()
    row("  RSS growth, 1000 users + 1000 roles + 10k perms", grow[0], grow[1], "KiB", higher=False)
    ep.stop()
    k.stop()


def h1load(port, path, body, n, c):
    """h2load --h1 (keep-alive, no pipelining): requests per second, -1 on errors."""
    args = ["h2load", "--h1", "-n", str(n), "-c", str(c), "-t", "1"]
    if body is not None:
        bf = tempfile.NamedTemporaryFile(delete=False)
        bf.write(body)
        bf.close()
        args += ["-d", bf.name]
    r = subprocess.run(args + ["http://127.0.0.1:%d%s" % (port, path)], capture_output=True, text=True)
    if body is not None:
        os.unlink(bf.name)
    return h2load_rate(r.stdout)


def embed_rows(n=100000):
    """In-process Range and durable Put (64 in flight, kvd.h's typed calls)
    against h2load's over loopback gRPC (-c 16 -m 8) to the same instance:
    calls per second and the instance's CPU per call; a watch callback's
    CPU per event (100 watchers, 20000 puts, less the puts alone)."""
    subprocess.run(["make", "-s", "-C", ROOT, "test/embedbench"], check=True)
    d = tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)
    port = free_port()
    p = subprocess.Popen([os.path.join(ROOT, "test", "embedbench"), d, "http://127.0.0.1:%d" % port, "3"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    figs = {}
    for line in p.stdout:
        w = line.split()
        if w[0] == "serving":
            break
        figs[w[0]] = (float(w[1]), float(w[2]))
    print("in-process (kvd.h) vs loopback gRPC (h2load -c 16 -m 8 -t 1), one kvd, data on %s" % DISK)
    print("%-46s %14s %14s %8s" % ("", "gRPC", "in-process", "ratio"))
    bodies = {"range": ("/etcdserverpb.KV/Range", R.RangeRequest(key=b"key000001")),
              "put": ("/etcdserverpb.KV/Put", R.PutRequest(key=b"key000001", value=b"v" * 100))}
    for name in ("range", "put"):
        path, rq = bodies[name]
        t0 = cpu_ticks(p.pid)
        rate = h2load(port, path, grpc_frame(rq.SerializeToString()), n, 16, 8)
        cpu = (cpu_ticks(p.pid) - t0) / os.sysconf("SC_CLK_TCK") / n * 1e6
        row(name.capitalize() + (" (durable)" if name == "put" else "") + ": calls/s", rate, figs[name][0], "/s")
        row(name.capitalize() + ": CPU per call", cpu, figs[name][1], "us", higher=False)
    print("%-46s %29s" % ("watch callback: CPU per event (100 watchers)", "%.3f us" % figs["watch_event"][1]))
    p.stdin.close()
    p.wait(timeout=30)
    subprocess.run(["rm", "-rf", d])


def http1_rows(n=100000):
    """HTTP/1.1 on the client port, the same h2load --h1 runs on both:
    /health, /metrics, gateway Range of one key, durable gateway Put."""
    ep = EtcdDisk()
    k = Kvd(KVD, [], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))
    wait_for(lambda: Client(ep.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    for s in (ep, k):
        Client(s.endpoint()).call("Put", R.PutRequest(key=b"k", value=b"v" * 100))
    print("HTTP/1.1 (h2load --h1 -t 1, keep-alive):")
    print("%-46s %14s %14s %8s" % ("", "etcd", "kvd", "kvd/etcd"))
    rng = b'{"key":"aw=="}'
    put = b'{"key":"aw==","value":"' + b"dnZ2" * 33 + b'"}'
    for name, path, body, c, nn in (("GET /health -c 16", "/health", None, 16, n),
                                    ("GET /metrics -c 4", "/metrics", None, 4, n // 20),
                                    ("gateway Range (one key) -c 16", "/v3/kv/range", rng, 16, n),
                                    ("gateway Put, durable -c 16", "/v3/kv/put", put, 16, n // 2)):
        row("  " + name, h1load(ep.port, path, body, nn, c), h1load(k.port, path, body, nn, c))
    ep.stop()
    k.stop()


def load_rows(row, servers, nkeys):
    """The side-by-side tables' last rows: nkeys loaded into each server in
    turn, then each one's RSS; then the servers stop and their data goes."""
    rates = []
    for _, srv in servers:
        t0 = time.time()
        load(srv.endpoint(), nkeys)
        rates.append(nkeys / (time.time() - t0))
    row("load %d keys x 100 B (txns of 128)" % nkeys, rates, "keys/s")
    time.sleep(1)
    row("RSS with %d keys" % nkeys, [proc(srv.p.pid, "VmRSS") for _, srv in servers], "KiB", higher=False)
    for _, srv in servers:
        srv.stop()
        os.system("rm -rf %s" % srv.dir)


def kv3_rows(n, nkeys):
    """The issue-26 figures in one run: etcd 3.7.3 (test/peers), Debian's
    etcd 3.4.23 and kvd, the same h2load calls and bodies, each server with
    its data on the same disk; ratios are kvd's over each etcd's."""
    from kvdtest import go_peer
    e37 = go_peer("etcd")
    if not e37:
        print("SKIPPED: needs the etcd 3.7.3 peer (test/lib/deps.sh test)")
        return
    servers = [("etcd 3.7.3", EtcdDisk(binary=e37)), ("etcd 3.4.23", EtcdDisk()),
               ("kvd", Kvd(KVD, ["--name", "bench"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)))]
    for _, srv in servers:
        wait_for(lambda: Client(srv.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
    print("%-40s %13s %13s %13s %9s %9s" % ("", "etcd 3.7.3", "etcd 3.4.23", "kvd", "kvd/3.7", "kvd/3.4"))

    def row3(name, vals, unit="req/s", higher=True):
        def fmt(v):
            return ("%.2f %s" if 0 <= v < 10 and v != int(v) else "%.0f %s") % (v, unit)
        ratios = [(vals[2] / v if higher else v / vals[2]) if v > 0 and vals[2] > 0 else float("nan") for v in vals[:2]]
        print("%-40s %13s %13s %13s %9s %9s" % ((name,) + tuple(fmt(v) for v in vals) +
                                               tuple("%.1fx" % r for r in ratios)), flush=True)
        if unit == "KiB":
            vals, unit = [v / 1024.0 for v in vals], "MiB"
        PLOT["rows"].append((name, dict(zip(PLOT["stores"], vals)), unit, higher))
    PLOT.update(title="kvd against etcd 3.7.3 and 3.4.23: the same h2load calls, fsync on, data on one disk",
                stores=[x[0] for x in servers])
    row3("idle RSS", [proc(srv.p.pid, "VmRSS") for _, srv in servers], "KiB", higher=False)
    put = grpc_frame(R.PutRequest(key=b"foo", value=b"bar").SerializeToString())
    rng = grpc_frame(R.RangeRequest(key=b"foo").SerializeToString())
    srng = grpc_frame(R.RangeRequest(key=b"foo", serializable=True).SerializeToString())
    row3("Put (durable) -c 1 -m 1", [h2load(srv.port, "/etcdserverpb.KV/Put", put, max(2000, n // 20), 1, 1)
                                     for _, srv in servers])
    row3("Put (durable) -c 16 -m 8", [h2load(srv.port, "/etcdserverpb.KV/Put", put, n, 16, 8) for _, srv in servers])
    for name, body in (("Range linearizable", rng), ("Range serializable", srng)):
        row3("%s -c 16 -m 8" % name, [h2load(srv.port, "/etcdserverpb.KV/Range", body, n, 16, 8)
                                      for _, srv in servers])
    load_rows(row3, servers, nkeys)


def cgroup_wrap(name, limit_mb):
    """A command prefix that runs the command inside a new cgroup (v1 memory
    controller, or v2) limited to limit_mb MiB: (prefix, the cgroup's dir)."""
    for root, limit in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup/unified", "memory.max"),
                        ("/sys/fs/cgroup", "memory.max")):
        if os.path.exists(os.path.join(root, "cgroup.procs")):
            d = os.path.join(root, "kvd-bench-%s-%d" % (name, os.getpid()))
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, limit), "w") as f:
                    f.write(str(limit_mb << 20))
            except OSError:
                continue
            return ["sh", "-c", 'echo $$ > %s/cgroup.procs && exec "$@"' % d, "sh"], d
    return None, None


def scale_rows(nkeys=1000000):
    """A million keys (nkeys) x 100 B beside etcd 3.7.3 and 3.4.23, one run:
    the load in txns of 128, RSS and what a key costs beyond its value,
    Range of a 10k-key interval, a full-keyspace RangeStream (3.7's), a
    Snapshot of the whole store, Defragment while a client keeps putting,
    HashKV, restart to first answer; then kvd and etcd 3.7.3 again, each in a
    128 MiB cgroup: does it load them all, and serve after."""
    import grpc
    from kvdtest import go_peer
    e37 = go_peer("etcd")
    if not e37:
        print("SKIPPED: needs the etcd 3.7.3 peer (test/lib/deps.sh test)")
        return
    print("%d keys x 100 B, %d CPUs, data on %s" % (nkeys, os.cpu_count(), DISK))
    print("%-44s %13s %13s %13s %9s %9s" % ("", "etcd 3.7.3", "etcd 3.4.23", "kvd", "kvd/3.7", "kvd/3.4"))

    def row3(name, vals, unit="req/s", higher=True):
        def fmt(v):
            return "-" if v is None else ("%.2f %s" if 0 <= v < 10 and v != int(v) else "%.0f %s") % (v, unit)
        ratios = [(vals[2] / v if higher else v / vals[2]) if v and vals[2] else float("nan") for v in vals[:2]]
        print("%-44s %13s %13s %13s %9s %9s" % ((name,) + tuple(fmt(v) for v in vals) +
                                                tuple("%.1fx" % r for r in ratios)), flush=True)

    def start(kind, d=None, port=None, wrap=(), wait=True):
        if kind == "kvd":
            return Kvd(KVD, ["--name", "bench"], data_dir=d or tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK),
                       port=port, wait=wait, wrap=wrap)
        return EtcdDisk(d, port, binary=e37 if kind == "etcd 3.7.3" else "etcd", wrap=wrap,
                        args=["--quota-backend-bytes", str(8 << 30)])

    def timed(f):
        t0 = time.time()
        r = f()
        return time.time() - t0, r

    def channel(srv):
        return grpc.insecure_channel(srv.endpoint(), options=[("grpc.max_receive_message_length", -1)])

    def unary(ch, path, req, resp):
        return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=getattr(R, resp).FromString)(req, timeout=600)

    kinds = ["etcd 3.7.3", "etcd 3.4.23", "kvd"]
    servers = [start(k) for k in kinds]
    for srv in servers:
        wait_for(lambda: Client(srv.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
    idle = [proc(srv.p.pid, "VmRSS") for srv in servers]
    row3("idle RSS", idle, "KiB", higher=False)
    rates = []
    for srv in servers:
        secs, _ = timed(lambda: load(srv.endpoint(), nkeys))
        rates.append(nkeys / secs)
    row3("load %d keys x 100 B (txns of 128)" % nkeys, rates, "keys/s")
    rss = [proc(srv.p.pid, "VmRSS") for srv in servers]
    row3("RSS with %d keys" % nkeys, rss, "KiB", higher=False)
    row3("  RSS per key beyond the idle process", [(r - i) * 1024.0 / nkeys for r, i in zip(rss, idle)], "B",
         higher=False)
    chans = [channel(srv) for srv in servers]
    ten = R.RangeRequest(key=b"key-0500000", range_end=b"key-0510000")
    vals = []
    for ch in chans:
        secs, r = timed(lambda: [unary(ch, "/etcdserverpb.KV/Range", ten, "RangeResponse") for _ in range(20)])
        vals.append(20 / secs if len(r[-1].kvs) == 10000 else None)
    row3("Range of 10k keys (1 MiB answer)", vals, "req/s")
    vals = []
    for kind, ch in zip(kinds, chans):
        if kind == "etcd 3.4.23":
            vals.append(None)
            continue
        stream = ch.unary_stream("/etcdserverpb.KV/RangeStream", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=R.RangeStreamResponse.FromString)
        secs, n = timed(lambda: sum(len(m.range_response.kvs) for m in stream(R.RangeRequest(key=b"\0", range_end=b"\0"),
                                                                                timeout=600)))
        vals.append(secs * 1000 if n == nkeys else None)
    row3("RangeStream of the whole keyspace", vals, "ms", higher=False)
    vals, sizes = [], []
    for ch in chans:
        stream = ch.unary_stream("/etcdserverpb.Maintenance/Snapshot", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=R.SnapshotResponse.FromString)
        secs, n = timed(lambda: sum(len(m.blob) for m in stream(R.SnapshotRequest(), timeout=600)))
        vals.append(secs * 1000)
        sizes.append(n)
    row3("Snapshot of the whole store", vals, "ms", higher=False)
    row3("  its size", sizes, "B", higher=False)
    vals, lats = [], []
    for srv, ch in zip(servers, chans):
        stop = threading.Event()
        lat = []
        th = threading.Thread(target=serial_puts, args=(srv.endpoint(), stop.is_set, b"key-0000007", lat))
        th.start()
        wait_for(lambda: len(lat) > 0 or not th.is_alive(), 30, 0.01)  # the writer is putting
        secs, _ = timed(lambda: unary(ch, "/etcdserverpb.Maintenance/Defragment", R.DefragmentRequest(),
                                      "DefragmentResponse"))
        stop.set()
        th.join()
        vals.append(secs * 1000)
        lats.append(pcts(lat)[2])
    row3("Defragment with %d live keys, a client putting" % nkeys, vals, "ms", higher=False)
    row3("  the slowest Put meanwhile", lats, "ms", higher=False)
    vals = []
    for ch in chans:
        secs, _ = timed(lambda: unary(ch, "/etcdserverpb.Maintenance/HashKV", R.HashKVRequest(), "HashKVResponse"))
        vals.append(secs * 1000)
    row3("HashKV", vals, "ms", higher=False)
    for ch in chans:
        ch.close()
    vals, rss = [], []
    for i, (kind, srv) in enumerate(zip(kinds, servers)):
        srv.stop()
        secs, p = first_answer(lambda: start(kind, srv.dir, srv.port, wait=False), srv.endpoint())
        vals.append(secs * 1000)
        wait_for(lambda: proc(p.p.pid, "VmRSS") > 0, 10)
        rss.append(proc(p.p.pid, "VmRSS"))
        servers[i] = p
    row3("restart to first answer", vals, "ms", higher=False)
    row3("RSS after restart", rss, "KiB", higher=False)
    for srv in servers:
        srv.stop()
        os.system("rm -rf %s" % srv.dir)
    # again, each alone in 128 MiB
    for kind in ("etcd 3.7.3", "kvd"):
        wrap, cg = cgroup_wrap(kind.split()[0], 128)
        if not wrap:
            print("in a 128 MiB cgroup: SKIPPED (no memory cgroup here)")
            break
        srv = start(kind, wrap=wrap)
        wait_for(lambda: Client(srv.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
        try:
            secs, _ = timed(lambda: load(srv.endpoint(), nkeys))
            c = Client(srv.endpoint())
            a = c.call("Range", R.RangeRequest(key=b"key-", range_end=b"key.", count_only=True), timeout=120)
            c.close()
            got = "%d keys at %.0f keys/s, then counted %s" % (nkeys, nkeys / secs, a[1].count if a[0] == "ok" else a)
        except Exception as ex:  # noqa: the point is to see it fail, if it does
            got = "failed: %s" % str(ex)[:120]
        peak = ""
        for f in ("memory.max_usage_in_bytes", "memory.peak"):
            if os.path.exists(os.path.join(cg, f)):
                peak = ", cgroup peak %d MiB" % (int(open(os.path.join(cg, f)).read()) >> 20)
        alive = srv.p.poll() is None
        print("in a 128 MiB cgroup, %-11s %s; %s%s" % (kind + ":", got, "alive" if alive else "killed (OOM)", peak),
              flush=True)
        if alive:
            srv.stop()
        os.system("rm -rf %s" % srv.dir)
        try:
            os.rmdir(cg)
        except OSError:
            pass


def before_rows(n, nkeys, before):
    """A change's cost in one run: etcd 3.7.3 (test/peers), kvd as built
    before the change (--before PATH) and kvd now, the same calls, data on
    the same disk; ratios over etcd 3.7.3, and now over before."""
    from kvdtest import go_peer
    e37 = go_peer("etcd")
    if not e37:
        print("SKIPPED: needs the etcd 3.7.3 peer (test/lib/deps.sh test)")
        return
    servers = [("etcd 3.7.3", EtcdDisk(binary=e37)),
               ("kvd before", Kvd(before, ["--name", "bench"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK))),
               ("kvd", Kvd(KVD, ["--name", "bench"], data_dir=tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)))]
    for _, srv in servers:
        wait_for(lambda: Client(srv.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 60)
    subprocess.run(["make", "-s", "-C", ROOT, "test/watchbench"], check=True)
    print("%-44s %13s %13s %13s %9s %9s %9s" % ("", "etcd 3.7.3", "kvd before", "kvd", "before/3.7", "kvd/3.7",
                                                 "kvd/before"))

    def rowb(name, vals, unit="req/s", higher=True):
        def fmt(v):
            return ("%.2f %s" if 0 <= v < 10 and v != int(v) else "%.0f %s") % (v, unit)

        def ratio(a, b):  # a's advantage over b
            return (a / b if higher else b / a) if a > 0 and b > 0 else float("nan")
        print("%-44s %13s %13s %13s %9s %9s %9s" % ((name,) + tuple(fmt(v) for v in vals) +
                                                     ("%.1fx" % ratio(vals[1], vals[0]), "%.1fx" % ratio(vals[2], vals[0]),
                                                      "%.2fx" % ratio(vals[2], vals[1]))), flush=True)
    rowb("idle RSS", [proc(srv.p.pid, "VmRSS") for _, srv in servers], "KiB", higher=False)
    put = grpc_frame(R.PutRequest(key=b"foo", value=b"bar").SerializeToString())
    rng = grpc_frame(R.RangeRequest(key=b"foo").SerializeToString())
    health = grpc_frame(b"")
    rowb("Health/Check -c 16 -m 8", [h2load(srv.port, "/grpc.health.v1.Health/Check", health, n, 16, 8)
                                     for _, srv in servers])
    rowb("Put (durable) -c 1 -m 1", [h2load(srv.port, "/etcdserverpb.KV/Put", put, max(2000, n // 20), 1, 1)
                                     for _, srv in servers])
    rowb("Put (durable) -c 16 -m 8", [h2load(srv.port, "/etcdserverpb.KV/Put", put, n, 16, 8) for _, srv in servers])
    rowb("Range linearizable -c 16 -m 8", [h2load(srv.port, "/etcdserverpb.KV/Range", rng, n, 16, 8)
                                           for _, srv in servers])
    rowb("watch: 1000 watchers on 1 key, 16 in flight", [watchbench(srv.port, 10, 100, 1, 3, 16)
                                                         for _, srv in servers], "ev/s")
    load_rows(rowb, servers, nkeys)


def k8s_rows(scale):
    """A small control plane's workload on etcd 3.7.3, kine (SQLite) and kvd,
    one after the other, data on the same disk: kube-apiserver (compaction
    every minute), kube-controller-manager and kube-scheduler of 1.37.2
    (test/k8s.py's), then 3000*scale ConfigMaps of 2 KiB, 200*scale
    Deployments of 5 (Pods Pending: no nodes), a watch on ConfigMaps, 25
    updates/s for 120*scale s, and every object deleted.  Per store: RSS
    (peak and at the end), CPU seconds, bytes written to disk, the data dir
    after compaction, the apiserver's request latency p50/p99 by verb (its
    /metrics) and the watch delivery delay (update sent -> event read)."""
    import http.client
    import json as js
    import ssl as sl
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import k8s
    ncm, ndep, secs, rate = int(3000 * scale), int(200 * scale), int(120 * scale), 25
    stores = (("etcd 3.7.3", lambda: k8s.EtcdStore(base=DISK)), ("kine", lambda: k8s.KineStore(base=DISK)),
              ("kvd", lambda: k8s.KvdStore(base=DISK)))
    ctx = sl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = sl.CERT_NONE
    res = {}
    for name, mk in stores:
        pki = k8s.pki()
        store = mk()
        api = k8s.Apiserver(pki, store, extra=["--etcd-compaction-interval", "1m"])
        ctl = k8s.Controllers(api)
        hdr = {"Authorization": "Bearer admin-token", "Content-Type": "application/json"}

        def io():
            with open("/proc/%d/io" % store.p.pid) as f:
                return dict(line.split(": ") for line in f.read().splitlines())

        def cpu():
            with open("/proc/%d/stat" % store.p.pid) as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

        def hwm():
            with open("/proc/%d/status" % store.p.pid) as f:
                return max(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))

        def conn():
            return http.client.HTTPSConnection("127.0.0.1", api.port, context=ctx, timeout=60)

        def many(reqs, threads=4):
            errs = []

            def worker(part):
                c = conn()
                for method, path, body in part:
                    c.request(method, path, body=body, headers=dict(hdr, **({"Content-Type": "application/merge-patch+json"}
                                                                           if method == "PATCH" else {})))
                    r = c.getresponse()
                    r.read()
                    if r.status >= 300:
                        errs.append((method, path, r.status))
            ts = [threading.Thread(target=worker, args=(reqs[i::threads],)) for i in range(threads)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            return errs
        w0, c0 = int(io()["write_bytes"]), cpu()
        blob = "x" * 2048
        errs = many([("POST", "/api/v1/namespaces/default/configmaps",
                      js.dumps({"metadata": {"name": "cm-%05d" % i}, "data": {"v": blob}})) for i in range(ncm)])
        errs += many([("POST", "/apis/apps/v1/namespaces/default/deployments", js.dumps(
            {"metadata": {"name": "d-%04d" % i}, "spec": {"replicas": 5, "selector": {"matchLabels": {"app": "d-%04d" % i}},
                                                          "template": {"metadata": {"labels": {"app": "d-%04d" % i}},
                                                                       "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}))
                      for i in range(ndep)])
        k8s.wait_for(lambda: k8s.count(api, "pods", "-n", "default") >= 5 * ndep, 900, 2)
        pods = k8s.count(api, "pods", "-n", "default")
        # the watch: each update carries its send time; the reader stamps arrival
        delays, stop, started = [], threading.Event(), threading.Event()
        c = conn()
        c.request("GET", "/api/v1/namespaces/default/configmaps?limit=1", headers=hdr)
        rv = js.loads(c.getresponse().read())["metadata"]["resourceVersion"]

        def watcher():  # from the list's revision: no initial events
            c = conn()
            c.request("GET", "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=%s&timeoutSeconds=%d" %
                      (rv, secs + 120), headers=hdr)
            r = c.getresponse()
            started.set()
            while not stop.is_set():
                line = r.readline()
                if not line:
                    break
                try:
                    ev = js.loads(line)
                    t = float(ev["object"]["data"].get("t", "0"))
                except (ValueError, KeyError, TypeError):
                    continue
                if t:
                    delays.append(time.time() - t)
        wt = threading.Thread(target=watcher, daemon=True)
        wt.start()
        started.wait(60)
        w1 = int(io()["write_bytes"])
        c = conn()
        n, t0 = 0, time.time()
        while time.time() - t0 < secs:
            due = t0 + n / rate
            if due > time.time():
                time.sleep(due - time.time())
            c.request("PATCH", "/api/v1/namespaces/default/configmaps/cm-%05d" % (n % ncm),
                      body=js.dumps({"data": {"t": "%.6f" % time.time()}}),
                      headers=dict(hdr, **{"Content-Type": "application/merge-patch+json"}))
            r = c.getresponse()
            r.read()
            n += 1
        k8s.wait_for(lambda: len(delays) >= n, 60, 0.1)  # every update's event read
        w2 = int(io()["write_bytes"])
        stop.set()
        errs += many([("DELETE", "/api/v1/namespaces/default/configmaps/cm-%05d" % i, None) for i in range(ncm)])
        errs += many([("DELETE", "/apis/apps/v1/namespaces/default/deployments/d-%04d" % i, None) for i in range(ndep)])
        k8s.wait_for(lambda: k8s.count(api, "pods", "-n", "default") == 0, 900, 2)
        # two compaction ticks after the deletes: the data dir as it stays
        def crev():
            return subprocess.run(["etcdctl", "--endpoints", store.url, "get", "compact_rev_key", "--print-value-only"],
                                  capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3")).stdout.strip()
        first = crev()
        k8s.wait_for(lambda: crev() != first, 150, 2)
        second = crev()
        k8s.wait_for(lambda: crev() != second, 150, 2)
        du = int(subprocess.run(["du", "-sk", store.dir], capture_output=True, text=True).stdout.split()[0])
        m = api.metrics()
        lat = {}
        for verb in ("POST", "GET", "LIST", "PATCH", "DELETE", "WATCH"):
            lat[verb] = (hist_q(m, "apiserver_request_duration_seconds", verb, 0.5),
                         hist_q(m, "apiserver_request_duration_seconds", verb, 0.99))
        delays.sort()
        res[name] = {"rss_peak": hwm(), "rss_end": store.rss_kb(), "cpu": cpu() - c0,
                     "written": int(io()["write_bytes"]) - w0, "per_update": (w2 - w1) / max(n, 1), "du": du, "lat": lat,
                     "delay": (delays[len(delays) // 2] if delays else -1, delays[int(len(delays) * 0.99)] if delays else -1),
                     "updates": n, "pods": pods, "errors": len(errs)}
        ctl.stop()
        api.stop()
        store.p.terminate()
        store.p.wait(60)
    names = [x[0] for x in stores]
    print("control plane of Kubernetes v1.37.2, %d ConfigMaps x 2 KiB, %d Deployments x 5, %d updates at %d/s" %
          (ncm, ndep, res["kvd"]["updates"], rate))
    print("%-34s %16s %16s %16s %9s %9s" % ("", names[0], names[1], names[2], "etcd/kvd", "kine/kvd"))

    def line(what, key, unit, fmt="%.1f"):
        v = [key(res[x]) for x in names]
        r = lambda a, b: ("%.1fx" % (a / b)) if a > 0 and b > 0 else "-"
        print("%-34s %16s %16s %16s %9s %9s" % ((what,) + tuple((fmt % x) + " " + unit for x in v) +
                                                  (r(v[0], v[2]), r(v[1], v[2]))), flush=True)
        if unit:  # every figure with a unit is better lower
            PLOT["rows"].append((what, dict(zip(names, v)), unit, False))
    PLOT.update(title="Kubernetes v1.37 on etcd 3.7.3, kine (SQLite) and kvd: the same control plane and load",
                stores=names)
    line("store RSS, peak", lambda r: r["rss_peak"] / 1024, "MiB")
    line("store RSS, at the end", lambda r: r["rss_end"] / 1024, "MiB")
    line("store CPU", lambda r: r["cpu"], "s")
    line("bytes written to disk", lambda r: r["written"] / 1048576, "MiB")
    line("bytes written per update", lambda r: r["per_update"] / 1024, "KiB")
    line("data dir after compaction", lambda r: r["du"] / 1024, "MiB")
    for verb in ("POST", "GET", "LIST", "PATCH", "DELETE"):
        line("apiserver %s p50" % verb, lambda r: r["lat"][verb][0] * 1000, "ms", "%.2f")
        line("apiserver %s p99" % verb, lambda r: r["lat"][verb][1] * 1000, "ms", "%.2f")
    line("watch delay p50", lambda r: r["delay"][0] * 1000, "ms", "%.2f")
    line("watch delay p99", lambda r: r["delay"][1] * 1000, "ms", "%.2f")
    line("Pods made by the controllers", lambda r: r["pods"], "", "%d")
    line("requests that failed", lambda r: r["errors"], "", "%d")


def hist_q(metrics, name, verb, q):
    """Quantile q of a Prometheus histogram's samples for one verb (all
    resources summed), interpolated within its bucket."""
    buckets = {}
    for line in metrics.splitlines():
        if not line.startswith(name + "_bucket{") or ('verb="%s"' % verb) not in line:
            continue
        le = line.partition('le="')[2].partition('"')[0]
        buckets[float("inf") if le == "+Inf" else float(le)] = buckets.get(
            float("inf") if le == "+Inf" else float(le), 0) + float(line.rsplit(" ", 1)[1])
    if not buckets:
        return -1
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total == 0:
        return -1
    want, prev_le, prev_n = q * total, 0.0, 0.0
    for le in les:
        if buckets[le] >= want:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (want - prev_n) / max(buckets[le] - prev_n, 1e-9)
        prev_le, prev_n = le, buckets[le]
    return les[-2]


def main(argv):
    rc = bench(argv)
    if "--plot" in argv and PLOT["rows"]:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
        import plot
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or "?"
        sub = "test/bench.py %s, one run on %s, %d CPUs, kvd at %s; raw figures under each row" % (
            " ".join(a for a in argv[1:] if a != "--plot" and a != argv[argv.index("--plot") + 1]),
            time.strftime("%Y-%m-%d"), os.cpu_count(), rev)
        path = argv[argv.index("--plot") + 1]
        with open(path, "w") as f:
            f.write(plot.svg(PLOT["title"], sub, PLOT["stores"], PLOT["rows"]))
        print("plot: %s (%d rows)" % (path, len(PLOT["rows"])))
    return rc


def bench(argv):
    n = int(argv[argv.index("--n") + 1]) if "--n" in argv else 100000
    nkeys = int(argv[argv.index("--keys") + 1]) if "--keys" in argv else 200000
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    if only == "rewrite":  # servers of their own, data of their own
        rewrite_rows(int(argv[argv.index("--mb") + 1]) if "--mb" in argv else 100)
        return 0
    if only == "life":
        life_rows()
        return 0
    if only == "snapshot":
        snapshot_rows(nkeys)
        return 0
    if only == "tls":
        tls_rows(n)
        return 0
    if only == "auth":
        auth_rows(n)
        return 0
    if only == "http1":
        http1_rows(n)
        return 0
    if only == "embed":
        embed_rows(n)
        return 0
    if only == "flash":
        flash_rows()
        return 0
    if "--writer" in argv:  # replica_rows' writer, a process of its own
        return paced_writer(argv[argv.index("--writer") + 1:])
    if only == "replica":
        replica_rows(int(argv[argv.index("--n") + 1]) if "--n" in argv else 20000)
        return 0
    if only == "k8s":
        k8s_rows(float(argv[argv.index("--scale") + 1]) if "--scale" in argv else 1.0)
        return 0
    if only == "kv3":
        kv3_rows(n, nkeys)
        return 0
    if only == "scale":
        scale_rows(int(argv[argv.index("--keys") + 1]) if "--keys" in argv else 1000000)
        return 0
    if "--before" in argv:
        before_rows(n, nkeys, argv[argv.index("--before") + 1])
        return 0
    kvd_dir = tempfile.mkdtemp(prefix="kvd-bench-", dir=DISK)
    e = EtcdDisk()
    k = Kvd(KVD, ["--name", "bench"], data_dir=kvd_dir)
    wait_for(lambda: Client(e.endpoint()).call("Range", R.RangeRequest(key=b"x"))[0] == "ok", 30)
    print("kvd vs %s, %d CPUs; h2load -t 1; data on %s" %
          (subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
           os.cpu_count(), DISK))
    print("%-46s %14s %14s %8s" % ("", "etcd", "kvd", "kvd/etcd"))
    row("idle RSS", proc(e.p.pid, "VmRSS"), proc(k.p.pid, "VmRSS"), "KiB", higher=False)
    row("binary size", os.path.getsize(subprocess.run(["which", "etcd"], capture_output=True, text=True)
                                       .stdout.strip()), os.path.getsize(KVD), "B", higher=False)
    empty = grpc_frame(b"")
    if only in ("", "transport"):
        for path in ("/grpc.health.v1.Health/Check", "/etcdserverpb.Maintenance/Status"):
            for c, m in ((1, 1), (16, 8)):
                row("%s -c %d -m %d" % (path.split("/")[-1], c, m), h2load(e.port, path, empty, n, c, m),
                    h2load(k.port, path, empty, n, c, m))
    if only in ("", "watch"):
        subprocess.run(["make", "-s", "-C", ROOT, "test/watchbench"], check=True)
        # first, while the heaps hold no freed pages that would hide the growth
        row("RSS per idle watcher (10 streams x 1000)", idle_watchers(e, e.port, 10, 1000),
            idle_watchers(k, k.port, 10, 1000), "B", higher=False)
        for name, keys, inflight in (("1000 watchers on 1 key, serial Put", 1, 1),
                                     ("1000 watchers on 1 key, 16 Puts in flight", 1, 16),
                                     ("1000 watchers on 1000 keys, 16 in flight", 1000, 16),
                                     ("1000 watchers on 1000 keys, 128 in flight", 1000, 128)):
            row("watch: " + name, watchbench(e.port, 10, 100, keys, 3, inflight),
                watchbench(k.port, 10, 100, keys, 3, inflight), "ev/s")
    if only in ("", "lease"):
        lease = "/etcdserverpb.Lease/"
        grant = grpc_frame(R.LeaseGrantRequest(TTL=600).SerializeToString())
        row("LeaseGrant (durable) -c 1 -m 1", h2load(e.port, lease + "LeaseGrant", grant, max(2000, n // 20), 1, 1),
            h2load(k.port, lease + "LeaseGrant", grant, max(2000, n // 20), 1, 1))
        row("LeaseGrant (durable) -c 16 -m 8", h2load(e.port, lease + "LeaseGrant", grant, n, 16, 8),
            h2load(k.port, lease + "LeaseGrant", grant, n, 16, 8))
        for side in (e, k):
            c = Client(side.endpoint())
            c.call("LeaseGrant", R.LeaseGrantRequest(ID=12345, TTL=600), service="etcdserverpb.Lease",
                   resp="LeaseGrantResponse")
            c.close()
        ka = grpc_frame(R.LeaseKeepAliveRequest(ID=12345).SerializeToString())
        row("LeaseKeepAlive (a stream per call) -c 16 -m 8", h2load(e.port, lease + "LeaseKeepAlive", ka, n, 16, 8),
            h2load(k.port, lease + "LeaseKeepAlive", ka, n, 16, 8))
        time.sleep(2)
        row("RSS with %d leases" % (n + max(2000, n // 20) + 1), proc(e.p.pid, "VmRSS"), proc(k.p.pid, "VmRSS"),
            "KiB", higher=False)
        ce, ck = cpu_ticks(e.p.pid), cpu_ticks(k.p.pid)
        time.sleep(5)
        hz = os.sysconf("SC_CLK_TCK")
        row("idle CPU with those leases (% of a core)", (cpu_ticks(e.p.pid) - ce) * 100.0 / hz / 5,
            (cpu_ticks(k.p.pid) - ck) * 100.0 / hz / 5, "%", higher=False)
    if only in ("", "confd"):
        confd_rows()
    if only in ("", "kv"):
        put = grpc_frame(R.PutRequest(key=b"foo", value=b"bar").SerializeToString())
        rng = grpc_frame(R.RangeRequest(key=b"foo").SerializeToString())
        srng = grpc_frame(R.RangeRequest(key=b"foo", serializable=True).SerializeToString())
        raw = fdatasync_rate()
        print("%-46s %14s" % ("disk: raw 130-byte append+fdatasync rate", "%.0f /s" % raw))
        pe = h2load(e.port, "/etcdserverpb.KV/Put", put, max(2000, n // 20), 1, 1)
        pk = h2load(k.port, "/etcdserverpb.KV/Put", put, max(2000, n // 20), 1, 1)
        row("Put (durable) -c 1 -m 1", pe, pk)
        print("%-46s %14s %14s" % ("  ... as a share of the raw fdatasync rate", "%.2f" % (pe / raw), "%.2f" % (pk / raw)))
        pe = h2load(e.port, "/etcdserverpb.KV/Put", put, n, 16, 8)
        pk = h2load(k.port, "/etcdserverpb.KV/Put", put, n, 16, 8)
        row("Put (durable) -c 16 -m 8", pe, pk)
        # flash wear: bytes the disk gets per put, a 10-byte key and a 100-byte value
        big = R.PutRequest(key=b"key-000001", value=b"v" * 100)
        we, wk = io_written(e.p.pid), io_written(k.p.pid)
        h2load(e.port, "/etcdserverpb.KV/Put", grpc_frame(big.SerializeToString()), n, 16, 8)
        h2load(k.port, "/etcdserverpb.KV/Put", grpc_frame(big.SerializeToString()), n, 16, 8)
        we, wk = io_written(e.p.pid) - we, io_written(k.p.pid) - wk
        rec = 9 + 4 + 4 + 1 + 8 + 4 + 3 + 3 + 1 + 1 + 1 + 10 + 100  # header, rev, nops, op
        row("bytes written per put of %d B (c16 m8)" % big.ByteSize(), we / n, wk / n, "B", higher=False)
        print("%-46s %14s %14s" % ("  ... per byte of kvd's log record (%d B)" % rec, "%.1f" % (we / n / rec),
                                   "%.1f" % (wk / n / rec)))
        for name, body in (("Range linearizable", rng), ("Range serializable", srng)):
            for c, m in ((1, 1), (16, 8)):
                row("%s -c %d -m %d" % (name, c, m), h2load(e.port, "/etcdserverpb.KV/Range", body, n, c, m),
                    h2load(k.port, "/etcdserverpb.KV/Range", body, n, c, m))
        t0 = time.time()
        load(e.endpoint(), nkeys)
        te = time.time() - t0
        t0 = time.time()
        load(k.endpoint(), nkeys)
        tk = time.time() - t0
        row("load %d keys x 100 B (txns of 128)" % nkeys, nkeys / te, nkeys / tk, "keys/s")
        time.sleep(1)
        row("RSS with %d keys" % nkeys, proc(e.p.pid, "VmRSS"), proc(k.p.pid, "VmRSS"), "KiB", higher=False)
        e.stop()
        k.stop()
        se, ep = first_answer(lambda: EtcdDisk(e.dir, e.port), e.endpoint())
        sk, kp = first_answer(lambda: Kvd(KVD, ["--name", "bench"], data_dir=kvd_dir, port=k.port, wait=False),
                              k.endpoint())
        row("start to first answer with %d keys" % nkeys, se * 1000, sk * 1000, "ms", higher=False)
        row("RSS after restart", proc(ep.p.pid, "VmRSS"), proc(kp.p.pid, "VmRSS"), "KiB", higher=False)
        print("%-46s %14s %14s" % ("data on disk", subprocess.run(["du", "-sh", e.dir], capture_output=True, text=True)
                                   .stdout.split()[0], subprocess.run(["du", "-sh", kvd_dir], capture_output=True,
                                                                      text=True).stdout.split()[0]))
        ep.stop()
        kp.stop()
    else:
        e.stop()
        k.stop()
    os.system("rm -rf %s %s" % (e.dir, kvd_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
