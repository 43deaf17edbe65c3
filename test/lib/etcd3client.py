#!/usr/bin/python3
"""python3-etcd3 0.12 against kvd on 127.0.0.1:PORT (run by test/watch.py):
watch_prefix, callbacks, cancel_watch, a compacted start revision.  Prints
one "CHECK ok|FAIL what" line per check."""
import sys
import threading

import etcd3


def check(cond, what):
    print("CHECK %s %s" % ("ok" if cond else "FAIL", what), flush=True)


def main(port):
    c = etcd3.client(port=port)
    events, done = [], threading.Event()
    it, cancel = c.watch_prefix("/p/")

    def consume():
        for ev in it:
            events.append((type(ev).__name__, ev.key, ev.value))
            if len(events) == 3:
                break
        done.set()
    threading.Thread(target=consume, daemon=True).start()
    # watch_prefix and add_watch_callback return once the server has
    # answered "created", so what follows is seen: no pause needed.
    c.put("/p/1", "a")
    c.put("/q", "no")
    c.put("/p/2", "b")
    c.delete("/p/1")
    check(done.wait(60), "watch_prefix got its events")
    check(events == [("PutEvent", b"/p/1", b"a"), ("PutEvent", b"/p/2", b"b"), ("DeleteEvent", b"/p/1", b"")],
          "watch_prefix events: %r" % events)
    cancel()
    got = []
    two, after = threading.Event(), threading.Event()
    wid = c.add_watch_callback("/k", lambda resp: (got.extend(resp.events), len(got) >= 2 and two.set()))
    c.put("/k", "1")
    c.put("/k", "2")
    check(two.wait(60) and len(got) == 2, "callback events: %r" % got)
    c.cancel_watch(wid)
    c.put("/k", "3")
    # A later watcher on the same stream sees /k2 only after anything the
    # cancelled one could still have been sent about /k.
    c.add_watch_callback("/k2", lambda resp: after.set())
    c.put("/k2", "x")
    check(after.wait(60) and len(got) == 2, "nothing after cancel_watch: %r" % got)
    value, meta = c.get("/k")
    check(value == b"3" and meta.version == 3, "get after the watch: %r" % (value,))
    rev = c.put("/k", "4").header.revision
    c.compact(rev)
    errs = []
    try:
        it2, cancel2 = c.watch("/k", start_revision=rev - 2)
        for _ in it2:
            break
    except Exception as e:  # RevisionCompactedError
        errs.append(type(e).__name__)
    check(errs == ["RevisionCompactedError"], "compacted start revision raises: %r" % errs)
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
