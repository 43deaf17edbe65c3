"""A host daemon embedding kvd (test/embed, built from test/embed.c) under
each of its five loop drivers -- poll (kvd_pollfds/kvd_process), epoll-et
(registration, EPOLLET, KVD_LOOP_EDGE), libev, libuv, sd-event -- beside
etcdctl 3.7.3 (test/peers) and Debian's etcdctl 3.4 on the same store over
TCP: each side sees the other's writes at the same revisions, watches both
ways, compare-and-swap; a kill -9 after a burst of in-process puts loses
none whose callback printed; an idle host's loop sleeps.  Run with
/usr/bin/python3 after make test/embed."""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest  # noqa: E402
from kvdtest import ROOT, check, free_port, run_tests, spawn, test  # noqa: E402

EMBED = os.environ.get("KVD_EMBED", os.path.join(ROOT, "test", "embed"))
DRIVERS = ["poll", "epoll-et", "libev", "libuv", "sd-event"]
ETCDCTL34 = "/usr/bin/etcdctl"


class Host:
    """test/embed DRIVER on a data dir, listening on a free port; its
    stdout lines collected as they come."""

    def __init__(self, driver, data_dir=None):
        self.driver = driver
        self.dir = data_dir or tempfile.mkdtemp(prefix="kvd-embed-")
        self.port = free_port()
        self.ep = "127.0.0.1:%d" % self.port
        self.err = open(os.path.join(self.dir, "..", os.path.basename(self.dir) + ".stderr"), "ab")
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
        self.p = spawn([EMBED, driver, self.dir, "http://" + self.ep], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=self.err, env=env)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        check(self.wait("ready"), "%s: ready" % driver)

    def _read(self):
        for raw in iter(self.p.stdout.readline, b""):
            with self.cv:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # EOF
            self.cv.notify_all()

    def send(self, line):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def wait(self, prefix, start=0, timeout=20):
        """The first line from index start that starts with prefix, or None."""
        end = time.time() + timeout
        with self.cv:
            while True:
                for line in self.lines[start:]:
                    if line is not None and line.startswith(prefix):
                        return line
                if None in self.lines[start:] or time.time() > end:
                    return None
                self.cv.wait(0.1)

    def cmd(self, line, prefix, timeout=20):
        start = len(self.lines)
        self.send(line)
        got = self.wait(prefix, start, timeout)
        check(got is not None, "%s: %r answered with %r (got %r)" % (self.driver, line, prefix, self.lines[start:]))
        return got or ""

    def errors(self):
        return [l for l in self.lines if l and l.startswith("error")]

    def quit(self):
        line = self.cmd("quit", "bye", 30)
        try:
            rc = self.p.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        check(line == "bye" and rc == 0, "%s: quit says bye and exits 0 (rc %r)" % (self.driver, rc))
        check(not self.errors(), "%s: no error lines: %r" % (self.driver, self.errors()))
        self.err.close()
        text = open(self.err.name, errors="replace").read()
        check("ERROR: AddressSanitizer" not in text and "runtime error" not in text,
              "%s: sanitizers quiet: %s" % (self.driver, text[-1500:]))


def field(line, name):
    """name=VALUE out of an answer line."""
    for w in line.split():
        if w.startswith(name + "="):
            return w[len(name) + 1:]
    return None


def ctl(binary, ep, *args, stdin=None):
    r = subprocess.run([binary, "--endpoints", ep] + list(args), input=stdin, capture_output=True, text=True,
                       timeout=30, env=dict(os.environ, ETCDCTL_API="3"))
    check(r.returncode == 0, "%s %s: %s" % (binary, " ".join(args), r.stderr[-400:]))
    return r.stdout


def ctl_get(binary, ep, key):
    """(value, mod_revision, header revision) of key as etcdctl gets it."""
    out = ctl(binary, ep, "get", key, "-w", "json")
    try:
        j = json.loads(out)
    except ValueError:
        return None, None, None
    kvs = j.get("kvs") or [{}]
    v = kvs[0].get("value")
    return (base64.b64decode(v).decode() if v is not None else None, kvs[0].get("mod_revision"),
            j.get("header", {}).get("revision"))


def ctls():
    out = [("3.4", ETCDCTL34)]
    e37 = kvdtest.go_peer("etcdctl")
    if e37:
        out.append(("3.7", e37))
    elif os.environ.get("KVD_REQUIRE_GO_PEERS"):
        check(False, "etcdctl 3.7.3 is not built and KVD_REQUIRE_GO_PEERS is set")
    else:
        print("  SKIPPED (the etcdctl 3.7.3 half): needs Go >= %s" % kvdtest.GO_MIN)
    return out


def beside_etcdctl(driver):
    h = Host(driver)
    h.cmd("watch k/", "watch k/ ready")
    for ver, e in ctls():
        p = "k/%s/" % ver
        # in-process put: etcdctl reads it at the revision the callback printed
        n = int(field(h.cmd("put %sa 1" % p, "put %sa " % p), "rev"))
        v, mod, rev = ctl_get(e, h.ep, p + "a")
        check(v == "1" and mod == n and rev == n, "%s: etcdctl %s get: %r mod %r rev %r, put said %d" %
              (driver, ver, v, mod, rev, n))
        check(h.wait("event PUT %sa=1 mod=%d" % (p, n)) is not None, "%s: the in-process watch saw its own put" % driver)
        # etcdctl's put: the in-process watch and get see it at one revision
        start = len(h.lines)
        ctl(e, h.ep, "put", p + "b", "2")
        ev = h.wait("event PUT %sb=2 mod=" % p, start)
        check(ev is not None, "%s: the in-process watch saw etcdctl %s's put" % (driver, ver))
        m = int(field(ev or "", "mod") or -1)
        _, mod, _ = ctl_get(e, h.ep, p + "b")
        g = h.cmd("get %sb" % p, "get %sb" % p)
        check(g == "get %sb=2 mod=%d rev=%d" % (p, m, m) and mod == m, "%s: get after etcdctl %s's put: %r, etcdctl mod %r"
              % (driver, ver, g, mod))
        # an outside watch from the next revision: sees the in-process put and delete
        w = spawn([e, "--endpoints", h.ep, "watch", p, "--prefix", "--rev", str(m + 1)], stdout=subprocess.PIPE,
                  stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, ETCDCTL_API="3"))
        c = int(field(h.cmd("put %sc 3" % p, "put %sc " % p), "rev"))
        d = h.cmd("del %sc" % p, "del %sc " % p)
        check(field(d, "deleted") == "1" and int(field(d, "rev")) == c + 1, "%s: del: %r" % (driver, d))
        got = [w.stdout.readline().rstrip("\n") for _ in range(5)]
        w.kill()
        check(got == ["PUT", p + "c", "3", "DELETE", p + "c"], "%s: etcdctl %s watch: %r" % (driver, ver, got))
        check(h.wait("event DELETE %sc= mod=%d" % (p, c + 1)) is not None, "%s: in-process watch saw the delete" % driver)
        # compare-and-swap: in-process on etcdctl's key, then etcdctl's txn on ours
        ok = h.cmd("cas %sb %d x" % (p, m), "cas %sb " % p)
        x = int(field(ok, "rev"))
        check(ok == "cas %sb ok rev=%d" % (p, x) and x == c + 2, "%s: cas with the right mod: %r" % (driver, ok))
        bad = h.cmd("cas %sb %d y" % (p, m), "cas %sb " % p)
        check(bad == "cas %sb fail rev=%d" % (p, x), "%s: cas with a stale mod: %r" % (driver, bad))
        v, mod, _ = ctl_get(e, h.ep, p + "b")
        check(v == "x" and mod == x, "%s: etcdctl %s sees the cas: %r %r" % (driver, ver, v, mod))
        t = ctl(e, h.ep, "txn", stdin='mod("%sb") = "%d"\n\nput %sb z\n\n\n' % (p, x, p))
        check(t.startswith("SUCCESS"), "%s: etcdctl %s txn: %r" % (driver, ver, t))
        check(h.wait("event PUT %sb=z mod=%d" % (p, x + 1)) is not None, "%s: the watch saw etcdctl's txn" % driver)
        t = ctl(e, h.ep, "txn", stdin='mod("%sb") = "%d"\n\nput %sb w\n\n\n' % (p, x, p))
        check(t.startswith("FAILURE"), "%s: etcdctl %s txn on a stale mod: %r" % (driver, ver, t))
        g = h.cmd("get %sb" % p, "get %sb" % p)
        check(g == "get %sb=z mod=%d rev=%d" % (p, x + 1, x + 1), "%s: get after the txns: %r" % (driver, g))
    # a lease granted in-process, as etcdctl sees it; a snapshot etcdctl reads
    lid = h.cmd("lease 60", "lease ").split()[1]
    out = ctl(ETCDCTL34, h.ep, "lease", "timetolive", lid)
    check("granted with TTL(60s)" in out, "%s: etcdctl lease timetolive %s: %r" % (driver, lid, out))
    snap = os.path.join(h.dir, "..", os.path.basename(h.dir) + ".db")
    r = int(field(h.cmd("snapshot " + snap, "snapshot "), "rev") or -1)
    _, _, now = ctl_get(ETCDCTL34, h.ep, "k/")
    st = ctl(ETCDCTL34, h.ep, "snapshot", "status", snap, "-w", "json")
    try:
        srev = json.loads(st).get("revision")
    except ValueError:
        srev = None
    check(r == now and srev == r, "%s: snapshot rev=%r, store %r, etcdctl snapshot status %r" % (driver, r, now, srev))
    h.quit()
    shutil.rmtree(h.dir, ignore_errors=True)


@test
def poll_beside_etcdctl():
    beside_etcdctl("poll")


@test
def epoll_et_beside_etcdctl():
    beside_etcdctl("epoll-et")


@test
def libev_beside_etcdctl():
    beside_etcdctl("libev")


@test
def libuv_beside_etcdctl():
    beside_etcdctl("libuv")


@test
def sd_event_beside_etcdctl():
    beside_etcdctl("sd-event")


@test
def kill9_loses_no_acknowledged_put():
    """Under each driver: in-process puts streamed in (10 lines a write),
    kill -9 once 100 callbacks printed, puts still coming; every put whose line appeared is there after a
    restart on the same data dir, at the revision it printed."""
    for d in DRIVERS:
        h = Host(d)
        def feed():  # puts keep coming, 10 a write, until the kill
            try:
                for i in range(0, 2000, 10):
                    h.send("\n".join("put burst/%04d v%d" % (j, j) for j in range(i, i + 10)))
                    time.sleep(0.002)
            except OSError:
                pass
        f = threading.Thread(target=feed, daemon=True)
        f.start()
        check(kvdtest.wait_for(lambda: sum(1 for l in h.lines if l and l.startswith("put ")) >= 100, 30),
              "%s: 100 puts acknowledged" % d)
        h.p.send_signal(signal.SIGKILL)
        h.p.wait(10)
        f.join(10)
        kvdtest.wait_for(lambda: None in h.lines, 10)  # every line it printed, read
        acked = {l.split()[1]: int(field(l, "rev")) for l in h.lines if l and l.startswith("put ")}
        h.err.close()
        h2 = Host(d, h.dir)
        out = ctl(ETCDCTL34, h2.ep, "get", "burst/", "--prefix", "-w", "json")
        kvs = {base64.b64decode(kv["key"]).decode(): kv["mod_revision"] for kv in json.loads(out).get("kvs", [])}
        lost = {k: r for k, r in acked.items() if kvs.get(k) != r}
        print("  %s: %d puts acknowledged before the kill, %d stored after it" % (d, len(acked), len(kvs)), flush=True)
        check(len(acked) >= 100 and not lost, "%s: %d acknowledged, %d stored, lost or moved: %r" %
              (d, len(acked), len(kvs), sorted(lost.items())[:5]))
        h2.quit()
        shutil.rmtree(h.dir, ignore_errors=True)


@test
def idle_loop_sleeps():
    """Under each driver, with a watch in process and an etcdctl watch
    connected, nothing happening: the process's CPU time over 2 s stays near
    0 (the host's loop is not spun by kvd's timer or descriptors)."""
    tck = os.sysconf("SC_CLK_TCK")
    for d in DRIVERS:
        h = Host(d)
        h.cmd("watch idle/", "watch idle/ ready")
        h.cmd("put idle/a 1", "put idle/a ")
        w = spawn([ETCDCTL34, "--endpoints", h.ep, "watch", "idle/", "--prefix"], stdout=subprocess.DEVNULL,
                  env=dict(os.environ, ETCDCTL_API="3"))
        time.sleep(1.0)

        def ticks():
            with open("/proc/%d/stat" % h.p.pid) as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return int(parts[11]) + int(parts[12])
        t0, w0 = ticks(), time.time()
        time.sleep(2.0)
        used = (ticks() - t0) / tck
        wall = time.time() - w0
        check(used <= 0.05 * wall, "%s: idle for %.1f s used %.2f s of CPU" % (d, wall, used))
        w.kill()
        h.quit()
        shutil.rmtree(h.dir, ignore_errors=True)


if __name__ == "__main__":
    if not os.access(EMBED, os.X_OK):
        print("test/embed is not built (make test/embed)")
        print("0 passed, 1 failed")
        sys.exit(1)
    sys.exit(run_tests(sys.argv))
