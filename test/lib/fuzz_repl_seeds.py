#!/usr/bin/python3
"""Seeds for test/fuzz_repl.c (written to test/corpus/repl/): what a real
member would send the replica, in the harness's op language (see
fuzz_repl.c): the first byte the store (0 empty, 1 three revisions to
verify, 2 the same, verified, 3 that with --replicate-user), then ops (sel << 3 | kind): 0 a message
(2 bytes of length, the bytes), 1 trailers (status, length, text), 2
RST_STREAM, 3 GOAWAY, 4 time passes, 5 the group commit, 6 raw bytes, 7 a
client's Put (sel odd) or linearizable Get.  The harness's own store holds
a=1 (rev 2), b=2 (rev 3), a=3 (rev 4) in modes 1 and 2.

    /usr/bin/python3 test/lib/fuzz_repl_seeds.py [DIR]
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvdtest import ROOT, pb  # noqa: E402

R = pb()["rpc"]
K = pb()["kv"]


def msg(sel, m):
    b = m.SerializeToString()
    return bytes([sel << 3 | 0, len(b) & 0xff, len(b) >> 8]) + b


def trailers(sel, status, text=b""):
    return bytes([sel << 3 | 1, status, len(text)]) + text


def timer(ticks):
    return bytes([4, ticks])


COMMIT = bytes([5])
PUT = bytes([1 << 3 | 7])
GET = bytes([7])


def kv(key, val, create, mod, ver, lease=0):
    return K.KeyValue(key=key, value=val, create_revision=create, mod_revision=mod, version=ver, lease=lease)


def events(rev, *evs):
    w = R.WatchResponse(header=R.ResponseHeader(revision=rev))
    for typ, x in evs:
        e = w.events.add()
        e.type = typ
        e.kv.CopyFrom(x)
    return w


def follow():
    """Mode 2: created, three revisions (a put, a delete, a leased put), a
    forwarded Put answered at 8 and its revision, a compaction probe, a
    progress notification, the watch cancelled as compacted."""
    out = bytes([2])
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=4), created=True))
    out += msg(0, events(5, (K.Event.PUT, kv(b"a", b"5", 2, 5, 3))))
    out += msg(0, events(6, (K.Event.DELETE, K.KeyValue(key=b"b", mod_revision=6))))
    out += msg(0, events(7, (K.Event.PUT, kv(b"c", b"7", 7, 7, 1, 0x77)), (K.Event.PUT, kv(b"d", b"7", 7, 7, 1))))
    out += COMMIT + PUT + COMMIT
    out += msg(1, R.PutResponse(header=R.ResponseHeader(revision=8)))
    out += msg(0, events(8, (K.Event.PUT, kv(b"k", b"v", 8, 8, 1))))
    out += COMMIT + GET + COMMIT
    out += msg(1, R.RangeResponse(header=R.ResponseHeader(revision=8), count=1))
    out += trailers(1, 0)
    out += COMMIT + timer(30) + COMMIT
    out += msg(1, R.RangeResponse(header=R.ResponseHeader(revision=8), count=3))
    out += trailers(1, 0)
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=8)))
    out += trailers(0, 11, b"mvcc: required revision has been compacted")
    return out


def verify():
    """Mode 1: HashKV refused as compacted (etcd 3.4 at its compaction
    revision), the keys at 4 compared page by page, then followed."""
    out = bytes([1])
    out += trailers(0, 11, b"mvcc: required revision has been compacted")
    out += COMMIT
    out += msg(0, R.RangeResponse(header=R.ResponseHeader(revision=9), count=2,
                                  kvs=[kv(b"a", b"3", 2, 4, 2), kv(b"b", b"2", 3, 3, 1)]))
    out += trailers(0, 0)
    out += COMMIT
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=9), created=True))
    out += msg(0, events(5, (K.Event.PUT, kv(b"b", b"x", 3, 5, 2))))
    out += COMMIT
    return out


def verify_paged():
    """Mode 1: two pages, the first with more=true; the second differs."""
    out = bytes([1])
    out += trailers(0, 11, b"mvcc: required revision has been compacted")
    out += msg(0, R.RangeResponse(header=R.ResponseHeader(revision=9), count=2, more=True,
                                  kvs=[kv(b"a", b"3", 2, 4, 2)]))
    out += trailers(0, 0)
    out += msg(0, R.RangeResponse(header=R.ResponseHeader(revision=9), count=1, kvs=[kv(b"b", b"9", 3, 3, 1)]))
    out += trailers(0, 0)
    return out


def hashkv():
    """Mode 1: a HashKV answer (not this store's: it must reseed)."""
    out = bytes([1])
    out += msg(0, R.HashKVResponse(header=R.ResponseHeader(revision=9), hash=12345, compact_revision=-1,
                                   hash_revision=4))
    out += trailers(0, 0)
    return out


def auth():
    """Mode 3: Authenticate answered with a token, then the follow."""
    out = bytes([3])
    out += msg(0, R.AuthenticateResponse(header=R.ResponseHeader(revision=4), token="AbCdEfGhIjKlMnOp.7"))
    out += trailers(0, 0)
    out += COMMIT
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=4), created=True))
    out += msg(0, events(5, (K.Event.PUT, kv(b"a", b"5", 2, 5, 3))))
    out += COMMIT + PUT + COMMIT
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=5), canceled=True,
                                  cancel_reason="etcdserver: invalid auth token"))
    return out


def seed():
    """Mode 0: the empty store seeds: created at 3, a real snapshot of a
    small store (kvd --snapshot-save) in two blobs, then events."""
    d = tempfile.mkdtemp(prefix="kvd-seed-")
    kvd = os.path.join(ROOT, "kvd")
    snap = os.path.join(d, "s.db")
    p = subprocess.Popen([kvd, "--data-dir", d + "/dd", "--listen-client-urls", "unix://" + d + "/s"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time
    for _ in range(100):
        if os.path.exists(d + "/s"):
            break
        time.sleep(0.05)
    p.terminate()
    p.wait()
    subprocess.run([kvd, "--data-dir", d + "/dd", "--snapshot-save", snap], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blob = open(snap, "rb").read()
    out = bytes([0])
    out += msg(0, R.WatchResponse(header=R.ResponseHeader(revision=1), created=True))
    out += COMMIT
    half = len(blob) // 2
    out += msg(1, R.SnapshotResponse(header=R.ResponseHeader(revision=1), remaining_bytes=len(blob) - half,
                                     blob=blob[:half]))
    out += msg(1, R.SnapshotResponse(remaining_bytes=0, blob=blob[half:]))
    out += trailers(1, 0)
    out += COMMIT
    out += msg(0, events(2, (K.Event.PUT, kv(b"x", b"1", 2, 2, 1))))
    out += COMMIT
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "test", "corpus", "repl")
    os.makedirs(out, exist_ok=True)
    for name, f in (("follow", follow), ("verify", verify), ("verify-paged", verify_paged), ("hashkv", hashkv), ("auth", auth),
                    ("seed", seed)):
        open(os.path.join(out, "seed-" + name), "wb").write(f())


if __name__ == "__main__":
    main()
