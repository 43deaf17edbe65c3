#!/usr/bin/python3
"""etcdctl 3.4 scenarios, run the same against Debian's etcd and kvd: exit
codes, outputs (JSON with ids and raft term removed) and error lines must be
identical.  Last line: "N passed, N failed".
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Etcd, check, test, run_tests

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))

# (argv, stdin) -- revisions below count from an empty store (revision 1)
SCRIPT = [
    (["put", "foo", "bar"], None),
    (["put", "foo", "baz", "--prev-kv"], None),
    (["put", "foo2", "x"], None),
    (["put", "/a/1", "one"], None),
    (["put", "/a/2", "two"], None),
    (["put", "/a/3", "three"], None),
    (["put", "/b", "bee"], None),
    (["put", "\xff", "ff"], None),
    (["get", "foo"], None),
    (["get", "foo", "-w", "json"], None),
    (["get", "foo", "-w", "fields"], None),
    (["get", "--prefix", "/a"], None),
    (["get", "--prefix", "/a", "-w", "json"], None),
    (["get", "--from-key", "/a"], None),
    (["get", "--from-key", "", "--keys-only"], None),
    (["get", "--prefix", "/", "--limit", "2"], None),
    (["get", "--prefix", "/", "--limit", "2", "-w", "json"], None),
    (["get", "foo", "--rev", "2"], None),
    (["get", "foo", "--rev", "3"], None),
    (["get", "foo", "--rev", "99"], None),
    (["get", "--prefix", "/", "--sort-by", "MODIFY", "--order", "DESCEND"], None),
    (["get", "--prefix", "/", "--sort-by", "VALUE", "--order", "ASCEND"], None),
    (["get", "--prefix", "/", "--sort-by", "CREATE", "--order", "DESCEND", "--limit", "2"], None),
    (["get", "--prefix", "/", "--sort-by", "VERSION"], None),
    (["get", "--prefix", "/", "--order", "DESCEND"], None),
    (["get", "--keys-only", "--prefix", "/a"], None),
    (["get", "--print-value-only", "foo"], None),
    (["get", "--consistency", "s", "foo"], None),
    (["get", "missing"], None),
    (["get", ""], None),
    (["put", "foo", "--ignore-value"], None),
    (["put", "nokey", "--ignore-value"], None),
    (["put", "foo", "v", "--lease", "1234"], None),
    (["put", "foo", "--ignore-lease", "--ignore-value"], None),
    (["del", "foo2"], None),
    (["del", "nothing"], None),
    (["del", "--prefix", "/a", "--prev-kv"], None),
    (["del", "--from-key", "/b", "-w", "json"], None),
    (["get", "--from-key", "", "-w", "json"], None),
    (["txn", "-i"], "value(\"foo\") = \"baz\"\n\nput foo qux\nget foo\n\nput foo nope\n\n"),
    (["txn", "-i"], "create(\"nope\") > \"0\"\n\nput x 1\n\nput y 2\nget y\n\n"),
    (["txn", "-i", "-w", "json"], "mod(\"foo\") < \"1000\"\nversion(\"foo\") > \"1\"\n\nput t1 a\nput t2 b\ndel x\n\n\n"),
    (["txn", "-i"], "\nput dup 1\nput dup 2\n\n\n"),
    (["get", "--from-key", ""], None),
    (["compaction", "5"], None),
    (["get", "foo", "--rev", "4"], None),
    (["get", "foo", "--rev", "5"], None),
    (["compaction", "5"], None),
    (["compaction", "--physical", "12"], None),
    (["compaction", "100"], None),
    (["get", "--from-key", "", "-w", "json"], None),
    (["endpoint", "health"], None),
    (["endpoint", "hashkv"], None),
    (["endpoint", "hashkv", "--rev", "13", "-w", "json"], None),
    (["endpoint", "hashkv", "--rev", "3"], None),
    (["alarm", "list"], None),
]


def norm_json(s):
    try:
        d = json.loads(s)
    except ValueError:
        return s

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k not in ("cluster_id", "member_id", "raft_term")}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o
    return json.dumps(strip(d), sort_keys=True)


def run(peer, argv, stdin):
    import subprocess
    r = subprocess.run(["etcdctl", "--endpoints", peer.endpoint()] + argv, input=(stdin or "").encode(),
                       capture_output=True, timeout=20, env=dict(os.environ, ETCDCTL_API="3"))
    out = r.stdout.decode(errors="replace")
    if "-w" in argv and argv[argv.index("-w") + 1] == "json":
        out = norm_json(out)
    out = re.sub(r"took = [0-9.]+[µmn]?s", "took = T", out)
    out = out.replace(peer.endpoint(), "ENDPOINT")
    err = [l for l in r.stderr.decode(errors="replace").splitlines() if l.startswith("Error")]
    return r.returncode, out, err[-1:] if err else []


@test
def etcdctl_side_by_side():
    e, k = Etcd(), Kvd(KVD)
    try:
        for argv, stdin in SCRIPT:
            a, b = run(e, argv, stdin), run(k, argv, stdin)
            check(a == b, "etcdctl %s:\n    etcd: %r\n    kvd:  %r" % (" ".join(argv), a, b))
    finally:
        e.stop()
        k.stop()


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
