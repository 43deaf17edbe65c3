#!/usr/bin/python3
"""etcd's own guarantees checked on kvd under faults, by etcd's own checkers:
test/robust (a Go program, its own module pinning go.etcd.io/etcd/tests/v3
v3.7.3 and porcupine v1.3.1; test/lib/deps.sh builds it beside the etcd
3.7.3 peers) drives etcd's robustness traffic -- the etcd mix and the
Kubernetes mix, 8 recorded clients with one request in flight each,
watchers with and without prev_kv and progress notify, RequestProgress,
compaction -- while a fault is injected, then runs etcd's validators
(linearizable KV under porcupine, serializable reads against a replay of what
the server persisted, watch ordered/unique/atomic/reliable/resumable/
bookmarkable/prev_kv/IsCreate/filter), its own durability check (the
revision never goes back across a crash) and its own lease probes (no lease
expires before its TTL from the last acknowledged keep-alive).  kvd's
persisted history comes from KVD_TEST_HISTORY (kvd.c section 10: the log
path, not the watch path being checked); etcd's from its WAL.

- bounded: every fault once on kvd (kill -9, power cut, SIGSTOP pause,
  connection resets, Defragment and automatic log rewrites, compaction racing
  resumed watches, crashes at the log rewrite's and the group commit's crash
  points, slow fsync, full disk, a slow watch reader, lease probes under
  pause and kill, a wall-clock step), fixed seeds; the faults that apply to
  etcd 3.7.3 also run on it, the control, which must pass too.  Then three
  faults picked by a random seed, printed (replay: test/robust ... -seed N).
- window_search_finds_a_planted_stale_read: a failing check prints where
  (test/robust/window.go: the validators' own entries, and for
  linearizability the shortest failing prefix); on two hand-built
  histories, the stale read planted in one must close that prefix and the
  other must pass.
- planted_bugs_are_caught: six test builds (-DKVD_TEST_BUG=N) each carry one
  bug; the harness must fail on each and name the guarantee it broke.

Alone: `make robustness` (the bounded run), `make robustness BUG=N` (against
bug build N: exits non-zero, naming the guarantee), `make robustness HOURS=H`
(the campaign).  Last line: "N passed, N failed".
"""
import hashlib
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import check, test, ROOT

KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))

# bug -> (faults that expose it, the guarantee the harness must name)
BUGS = {
    1: ("powercut", "durability"),              # a Put acknowledged before its fdatasync
    2: ("none", "serializable reads"),          # stale reads served one revision too old
    3: ("none", "watch resumable"),             # a watch resumed in history skips its start revision
    4: ("none", "watch unique"),                # the first record after a compaction sent twice
    # progress one revision ahead of the events delivered: etcd's validators
    # say Bookmarkable when a later event on that watch is at or below it,
    # Reliable when it was the watch's last response (the events up to the
    # last revision a watch was told of are missing)
    5: ("none", "watch bookmarkable|watch reliable"),
    6: ("lease-pause", "lease TTL"),            # a lease expires 1 s early
}


def robust_src():
    """test/lib/deps.sh's robust_src: the hash of test/robust's go.mod, go.sum
    and *.go (each name, a newline, its contents) -- what bin/robust.src says
    the built harness was built from."""
    d = os.path.join(ROOT, "test", "robust")
    h = hashlib.sha256()
    for f in ["go.mod", "go.sum"] + sorted(f for f in os.listdir(d) if f.endswith(".go")):
        h.update(f.encode() + b"\n")
        with open(os.path.join(d, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def harness():
    b = kvdtest.go_peer("robust")
    if not b:
        raise kvdtest.Skipped("needs Go >= %s (test/lib/deps.sh builds test/robust with it)" % kvdtest.GO_MIN)
    try:
        with open(b + ".src") as f:
            built = f.read().strip()
    except OSError:
        built = ""
    if built != robust_src():  # never check with a harness older than test/robust
        raise kvdtest.Skipped("the robust program is older than test/robust (test/lib/deps.sh test builds it)")
    return b


def robust(kvd, *args, timeout=900):
    cmd = [harness(), "-kvd", kvd] + list(args)
    print("  $ %s" % " ".join(cmd), flush=True)
    # errors="replace": go-cmp's diffs put random non-breaking spaces in, which the
    # harness's truncation can cut in half
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    for line in r.stdout.splitlines():
        if not line.startswith("ok "):
            print("    " + line, flush=True)
    return r


@test
def bounded():
    etcd = kvdtest.oracle()
    r = robust(KVD_TEST, "-etcd", etcd, "-seed", "1000")
    check(r.returncode == 0, "the bounded run found a violation or could not run: %s" % r.stderr[-2000:])
    ran = set(l.split()[1].split("/")[2] for l in r.stdout.splitlines() if l.startswith("ok ") and "kvd/" in l)
    names = subprocess.run([harness(), "-list"], capture_output=True, text=True).stdout.split()
    check(names and ran == set(names), "every fault ran on kvd: missing %s" % sorted(set(names) - ran))
    check(any(l.startswith("ok   etcd/") for l in r.stdout.splitlines()), "the control (etcd 3.7.3) ran")
    seed = random.randrange(1, 1 << 30)
    pick = random.Random(seed).sample(names, 3)
    print("  random seed %d: %s" % (seed, ",".join(pick)), flush=True)
    r = robust(KVD_TEST, "-seed", str(seed), "-only", ",".join(pick))
    check(r.returncode == 0, "seed %d (%s) found a violation: replay with test/robust -kvd %s -seed %d -only %s"
          % (seed, ",".join(pick), KVD_TEST, seed, ",".join(pick)))


@test
def window_search_finds_a_planted_stale_read():
    r = subprocess.run([harness(), "-selftest"], capture_output=True, text=True, timeout=300)
    print(r.stdout, end="")
    check(r.returncode == 0 and "selftest: ok" in r.stdout, "the window search: %s %s" % (r.stdout[-1500:], r.stderr[-500:]))


@test
def planted_bugs_are_caught():
    harness()
    for n, (faults, want) in sorted(BUGS.items()):
        kvd = os.path.join(ROOT, "test", "kvd-bug%d" % n)
        if not check(os.access(kvd, os.X_OK), "%s is built (make check builds it)" % kvd):
            continue
        r = robust(kvd, "-seed", str(2000 + 100 * n), "-only", faults, "-rounds", "3", "-stop")
        check(r.returncode == 1 and any(("VIOLATION of " + w) in r.stdout for w in want.split("|")),
              "bug %d: the harness names %r: %s" % (n, want, r.stdout[-1500:]))


def main(argv):
    opts, rest = kvdtest.split_options(argv, ["--bug", "--hours"])
    if "--bug" in opts or "--hours" in opts:  # make robustness BUG=N / HOURS=H: the harness alone, its exit code
        n = opts.get("--bug")
        kvd = os.path.join(ROOT, "test", "kvd-bug%s" % n) if n else KVD_TEST
        args = ["-seed", "1000"] + (["-hours", opts["--hours"]] if "--hours" in opts else [])
        etcd = kvdtest.go_peer("etcd")
        if etcd and not n:
            args += ["-etcd", etcd]
        try:
            b = harness()
        except kvdtest.Skipped as e:
            print("SKIPPED: %s" % e)
            return 1 if os.environ.get("KVD_REQUIRE_GO_PEERS") else 0
        return subprocess.call([b, "-kvd", kvd] + args)
    return kvdtest.run_tests(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
