#!/usr/bin/python3
"""A full disk: kvd's data dir on a tiny tmpfs (needs root to mount).
Writes fail cleanly with etcd's "database space exceeded" and raise NOSPACE,
reads go on, nothing unacknowledged appears; on the full disk deletes,
compaction, lease expiry, a rewrite and the disarm still work (the reserve);
a rewrite that runs out of space is abandoned and kvd serves on; after a
restart everything acknowledged is there.  etcd's NOSPACE runbook on a full
1 MiB flash, beside etcd 3.7.3; the reserve on a compressing btrfs (a loop
image, btrfs-progs).  Last line: "N passed, N failed".
"""
import contextlib
import functools
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Client, pb, check, test, run_tests, free_port, etcdctl, wait_for

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
R = pb()["rpc"]


@contextlib.contextmanager
def tmpfs(size):
    """A tmpfs of that size, mounted for the with block (None if it cannot be)."""
    mnt = tempfile.mkdtemp(prefix="kvd-enospc-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", mnt], capture_output=True)
    if not check(r.returncode == 0, "mount a %s tmpfs (root needed): %s" % (size, r.stderr.decode().strip())):
        os.rmdir(mnt)
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)


def on_tmpfs(size):
    """A test that gets a fresh tmpfs of that size."""
    def wrap(fn):
        @functools.wraps(fn)
        def run():
            with tmpfs(size) as mnt:
                if mnt:
                    fn(mnt)
        return test(run)
    return wrap


@on_tmpfs("1m")
def full_disk(mnt):
    filler = os.path.join(mnt, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * 300000)
    d = os.path.join(mnt, "data")
    port = free_port()
    k = Kvd(KVD, data_dir=d, port=port)
    c = Client(k.endpoint())
    check(os.path.getsize(os.path.join(d, "kvd.reserve")) == 131072, "the reserve is held")
    lease = c.call("LeaseGrant", R.LeaseGrantRequest(TTL=3), service="etcdserverpb.Lease",
                   resp="LeaseGrantResponse")[1].ID
    c.call("Put", R.PutRequest(key=b"leased", value=b"v", lease=lease))
    acked, errors = {}, []
    for i in range(400):
        key = b"key%04d" % i
        v = b"%d" % i * 800
        ans = c.call("Put", R.PutRequest(key=key, value=v))
        if ans[0] == "ok":
            acked[key] = (v, ans[1].header.revision)
        else:
            errors.append(ans)
            if len(errors) >= 5:
                break
    check(len(acked) > 20 and errors, "writes stopped when the disk filled (%d acked)" % len(acked))
    check(all(e[1] == "RESOURCE_EXHAUSTED" and e[2] == "etcdserver: mvcc: database space exceeded"
              for e in errors), "etcd's error for a full store: %r" % errors[:2])
    t = R.TxnRequest()
    t.success.add().request_put.CopyFrom(R.PutRequest(key=b"txn", value=b"x" * 5000))
    ans = c.call("Txn", t)
    check(ans[0] == "err" and ans[1] == "RESOURCE_EXHAUSTED", "a txn fails too: %r" % (ans,))
    # reads keep working and see exactly the acknowledged state
    rev = max(r for v, r in acked.values())
    ans = c.call("Range", R.RangeRequest(key=b"key", range_end=b"kez", keys_only=True))
    check(ans[0] == "ok" and len(ans[1].kvs) == len(acked) and ans[1].header.revision == rev,
          "reads serve the acknowledged writes only: %d keys, rev %s" %
          (len(ans[1].kvs) if ans[0] == "ok" else -1, ans[1].header.revision if ans[0] == "ok" else ans))
    check(k.alive(), "kvd alive")
    st = c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")[1]
    check([e.endswith("alarm:NOSPACE") for e in st.errors] == [True], "NOSPACE raised: %r" % list(st.errors))
    check(not os.path.exists(os.path.join(d, "kvd.reserve")), "the reserve given back")
    # on the full disk: the lease expires (its key goes), deletes and compaction work
    check(wait_for(lambda: c.call("Range", R.RangeRequest(key=b"leased"))[1].count == 0, 30),
          "an expired lease's key is deleted on the full disk")
    gone = sorted(acked)[:-3]
    for key in gone:
        ans = c.call("DeleteRange", R.DeleteRangeRequest(key=key))
        if ans[0] != "ok":
            break
    check(ans[0] == "ok", "deletes work on the full disk: %r" % (ans,))
    for key in gone:
        del acked[key]
    rev = c.call("Range", R.RangeRequest(key=b"x"))[1].header.revision
    ans = c.call("Compact", R.CompactionRequest(revision=rev))
    check(ans[0] == "ok", "compaction works on the full disk: %r" % (ans,))
    ans = c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                 resp="DefragmentResponse", timeout=60)
    check(ans[0] == "ok", "a rewrite works on the full disk: %r" % (ans,))
    ans = c.call("Put", R.PutRequest(key=b"after", value=b"ok"))
    check(ans[0] == "err" and ans[2] == "etcdserver: mvcc: database space exceeded",
          "space is back, but NOSPACE stays until disarmed, as etcd: %r" % (ans,))
    r = etcdctl(k, "alarm", "disarm")
    check(r[0] == 0 and "alarm:NOSPACE" in r[1], "etcdctl alarm disarm: %r" % (r,))
    check(os.path.exists(os.path.join(d, "kvd.reserve")), "the reserve is made again")
    os.unlink(filler)
    ans = c.call("Put", R.PutRequest(key=b"after", value=b"ok"))
    check(ans[0] == "ok" and ans[1].header.revision == rev + 1, "writes resume: %r" % (ans,))
    acked[b"after"] = (b"ok", rev + 1)
    c.close()
    check(k.stop() == 0, "clean exit")
    k = Kvd(KVD, data_dir=d, port=port)
    c = Client(k.endpoint())
    bad = [key for key, (v, rv) in acked.items()
           if (lambda a: a[0] != "ok" or len(a[1].kvs) != 1 or a[1].kvs[0].value != v or
               a[1].kvs[0].mod_revision != rv)(c.call("Range", R.RangeRequest(key=key)))]
    check(not bad, "after a restart every acknowledged write is there: %r" % bad[:3])
    ans = c.call("Range", R.RangeRequest(key=b"txn"))
    check(ans[0] == "ok" and not ans[1].kvs, "the failed txn never appeared")
    c.close()
    k.stop()


@on_tmpfs("3m")
def out_of_space_during_a_rewrite(mnt):
    d = os.path.join(mnt, "data")
    k = Kvd(KVD, data_dir=d, args=["--reserve-bytes", "0", "--auto-rewrite=false"])
    c = Client(k.endpoint())
    for i in range(100):  # 1.2 MB that a rewrite must keep, then history to drop
        c.call("Put", R.PutRequest(key=b"k%03d" % i, value=b"a" * 12000))
    c.call("Put", R.PutRequest(key=b"k000", value=b"b"))
    rev = c.call("Range", R.RangeRequest(key=b"k000"))[1].header.revision
    c.call("Compact", R.CompactionRequest(revision=rev))
    st = os.statvfs(mnt)
    filler = os.path.join(mnt, "filler")
    with open(filler, "wb") as f:  # leave less room than the kept data
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 400000))
    ans = c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                 resp="DefragmentResponse", timeout=60)
    check(ans[0] == "err" and ans[1] == "RESOURCE_EXHAUSTED" and "No space left" in ans[2],
          "the rewrite is abandoned with its reason: %r" % (ans,))
    check(not os.path.exists(os.path.join(d, "kvd.log.new")), "its partial file is gone")
    check(wait_for(lambda: "log rewrite abandoned" in k.logtext(), 30), "and the log says so")
    ans = c.call("Range", R.RangeRequest(key=b"k", range_end=b"l", count_only=True))
    check(ans[0] == "ok" and ans[1].count == 100 and k.alive(), "kvd serves from the old log")
    ans = c.call("Put", R.PutRequest(key=b"small", value=b"s"))
    check(ans[0] == "ok", "and takes writes: %r" % (ans,))
    os.unlink(filler)
    ans = c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                 resp="DefragmentResponse", timeout=60)
    check(ans[0] == "ok", "with room again the rewrite works: %r" % (ans,))
    ans = c.call("Range", R.RangeRequest(key=b"k050"))
    check(ans[0] == "ok" and ans[1].kvs[0].value == b"a" * 12000, "data intact")
    c.close()
    k.stop()


@test
def reserve_holds_space_on_a_compressing_fs():
    """On a filesystem that compresses what it stores (btrfs with
    compress-force=zstd, as jffs2/ubifs overlays compress on OpenWrt; those
    cannot be mounted here), the reserve file holds back its size: its bytes
    do not compress (before: zeros, which held back almost nothing)."""
    d = tempfile.mkdtemp(prefix="kvd-btrfs-")
    img, mnt = d + "/img", d + "/mnt"
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(160 << 20)
    mk = subprocess.run(["mkfs.btrfs", "-q", img], capture_output=True, text=True)
    mo = subprocess.run(["mount", "-o", "loop,compress-force=zstd", img, mnt], capture_output=True, text=True)
    if not check(mk.returncode == 0 and mo.returncode == 0, "a compressing btrfs mounted: %s %s" % (mk.stderr, mo.stderr)):
        return
    try:
        def free():
            os.sync()
            subprocess.run(["btrfs", "filesystem", "sync", mnt], capture_output=True)
            st = os.statvfs(mnt)
            return st.f_bavail * st.f_frsize
        size = 16 << 20
        f0 = free()
        k = Kvd(KVD, data_dir=mnt + "/data", args=["--reserve-bytes", str(size)])
        held = f0 - free()
        k.stop()
        with open(mnt + "/data/kvd.reserve", "rb") as f:
            data = f.read()
        import zlib
        print("    a %d-byte reserve on btrfs (zstd): %d bytes of free space held back" % (size, held))
        check(len(data) == size and len(zlib.compress(data[:1 << 20])) > (1 << 20) * 0.99,
              "the reserve's bytes do not compress")
        check(held >= size * 0.9, "it holds back its size there: %d of %d" % (held, size))
    finally:
        subprocess.run(["umount", mnt])
        subprocess.run(["rm", "-rf", d])


def _runbook(srv):
    """etcd's NOSPACE runbook, as its operators run it: delete, compact at the
    current revision, defrag, disarm.  dbSizeInUse before and after."""
    st = lambda: etcdctl(srv, "endpoint", "status", "-w", "json")
    import json
    before = json.loads(st()[1])[0]["Status"]["dbSizeInUse"]
    r1 = etcdctl(srv, "del", "k", "--prefix")
    rev = json.loads(st()[1])[0]["Status"]["header"]["revision"]
    r2 = etcdctl(srv, "compaction", str(rev), "--physical")
    r3 = etcdctl(srv, "defrag", timeout=120)
    r4 = etcdctl(srv, "alarm", "disarm")
    after = json.loads(st()[1])[0]["Status"]
    return before, after["dbSizeInUse"], after["dbSize"], [r[0] for r in (r1, r2, r3, r4)], (r1, r2, r3, r4)


@on_tmpfs("1m")
def nospace_runbook_frees_a_full_1m_flash(mnt):
    """A 1 MiB flash filled with 900-byte values to NOSPACE: etcd's runbook
    (del --prefix, compaction at the current revision, defrag, disarm)
    leaves the store as small as etcd 3.7.3 leaves its own after the same
    steps (measured beside it, off the tmpfs), the log file small on the
    flash, and writes resume.  Before: deleted values stayed in the base of
    the rewrite, which then ran out of room."""
    from kvdtest import Etcd
    d = os.path.join(mnt, "data")
    k = Kvd(KVD, data_dir=d)
    c = Client(k.endpoint())
    n = 0
    for i in range(2000):
        if c.call("Put", R.PutRequest(key=b"k%04d" % i, value=b"v" * 900))[0] != "ok":
            break
        n += 1
    check(n > 300 and c.call("Put", R.PutRequest(key=b"x", value=b"1"))[0] == "err", "%d values, then NOSPACE" % n)
    before, after, size, rcs, out = _runbook(k)
    logsize = os.path.getsize(os.path.join(d, "kvd.log"))
    ok = c.call("Put", R.PutRequest(key=b"after", value=b"ok"))
    c.close()
    k.stop()
    e = Etcd()
    ce = Client(e.endpoint())
    for i in range(n):
        ce.call("Put", R.PutRequest(key=b"k%04d" % i, value=b"v" * 900))
    ce.close()
    eb, ea, es, ercs, _ = _runbook(e)
    e.stop()
    print("    %d values of 900 B: dbSizeInUse %d -> %d B on kvd (log %d B), %d -> %d B on etcd 3.7.3 (%.2fx etcd's)"
          % (n, before, after, logsize, eb, ea, after / ea))
    check(rcs == [0, 0, 0, 0] and ercs == [0, 0, 0, 0], "the runbook's four steps succeed on both: %r" % (out,))
    check(after <= ea and logsize <= ea and after * 10 < before, "kvd keeps no more than etcd: %d / %d" % (after, ea))
    check(ok[0] == "ok", "writes resume: %r" % (ok,))


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
