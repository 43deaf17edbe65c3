#!/usr/bin/python3
"""A full disk: kvd's data dir on a 1 MiB tmpfs (needs root to mount).
Writes fail cleanly with etcd's "database space exceeded", reads go on,
nothing unacknowledged appears, kvd recovers when space comes back and after
a restart everything acknowledged is there.  Last line: "N passed, N failed".
"""
import os
import subprocess
import sys
import tempfile

from kvdtest import ROOT, Kvd, Client, pb, check, test, run_tests, free_port

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
R = pb()["rpc"]


@test
def full_disk():
    mnt = tempfile.mkdtemp(prefix="kvd-enospc-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True)
    if not check(r.returncode == 0, "mount a 1 MiB tmpfs (root needed): %s" % r.stderr.decode().strip()):
        return
    try:
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * 300000)
        d = os.path.join(mnt, "data")
        port = free_port()
        k = Kvd(KVD, data_dir=d, port=port)
        c = Client(k.endpoint())
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
        # space comes back: writes work again
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
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
