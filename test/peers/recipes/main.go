// recipes: clientv3 3.7's own recipes (concurrency Mutex, Election and STM,
// leasing, ordering, mirror, namespace, watch progress) against one etcd v3
// endpoint, printing a transcript on stdout: one line per observable result,
// nothing that legitimately differs between two servers that start empty and
// see the same operations (no lease ids, times or member ids; revisions only
// relative to the start of their section and only where the section is
// sequential).  test/etcd37.py runs it against etcd 3.7.3 and kvd and
// compares the transcripts line by line.
//
// Usage: recipes HOST:PORT.  Exit status 0 when every step behaved as the
// recipe promises; 1 (with "recipes: FAIL: ..." on stderr) on any
// unexpected error or broken promise; 2 on a bad command line.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/leasing"
	"go.etcd.io/etcd/client/v3/mirror"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.etcd.io/etcd/client/v3/ordering"
	"go.uber.org/zap"
)

var (
	ctx      context.Context // the whole run's deadline
	endpoint string
	cli      *clientv3.Client // the main client; others from newClient
	outMu    sync.Mutex
	section  string
	base     int64 // the store revision at the start of the section
)

func out(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Printf("%s: %s\n", section, fmt.Sprintf(format, args...))
}

func fail(format string, args ...any) {
	outMu.Lock()
	os.Stdout.Sync()
	fmt.Fprintf(os.Stderr, "recipes: FAIL: %s: %s\n", section, fmt.Sprintf(format, args...))
	os.Exit(1)
}

func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

func expect(ok bool, format string, args ...any) {
	if !ok {
		fail(format, args...)
	}
}

func newClient() *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	must(err, "clientv3.New")
	return c
}

// begin starts a section: its lines are prefixed with name, its revisions
// counted from the store revision now.
func begin(name string) {
	section = name
	base = curRev()
}

func curRev() int64 {
	r, err := cli.Get(ctx, "/recipes/rev-probe")
	must(err, "Get (revision probe)")
	return r.Header.Revision
}

// rel is a revision relative to the section's start.
func rel(r int64) string { return fmt.Sprintf("+%d", r-base) }

func get(c *clientv3.Client, key string) string {
	r, err := c.Get(ctx, key)
	must(err, "Get "+key)
	if len(r.Kvs) == 0 {
		return "<none>"
	}
	return string(r.Kvs[0].Value)
}

func put(c *clientv3.Client, key, val string) *clientv3.PutResponse {
	r, err := c.Put(ctx, key, val)
	must(err, "Put "+key)
	return r
}

func count(prefix string) int64 {
	r, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	must(err, "Get count "+prefix)
	return r.Count
}

// waitFor polls cond (every 10 ms, up to 20 s) for another goroutine's
// progress, so that no line depends on timing; the only fixed waits (300 or
// 500 ms) show that something does not happen.
func waitFor(what string, cond func() bool) {
	for t := time.Now(); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Since(t) > 20*time.Second {
			fail("timed out waiting for %s", what)
		}
	}
}

func errName(err error) string {
	for _, e := range []error{concurrency.ErrLocked, concurrency.ErrLockReleased, concurrency.ErrElectionNotLeader,
		concurrency.ErrElectionNoLeader, concurrency.ErrSessionExpired} {
		if errors.Is(err, e) {
			return fmt.Sprintf("error %q", e.Error())
		}
	}
	if err == nil {
		return "ok"
	}
	fail("unexpected error: %v", err)
	return ""
}

func session(c *clientv3.Client, ttl int) *concurrency.Session {
	s, err := concurrency.NewSession(c, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	must(err, "NewSession")
	return s
}

func result(ch chan error, d time.Duration) (error, bool) {
	select {
	case err := <-ch:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// ---------------------------------------------------------------- Mutex

func mutexRecipe() {
	begin("mutex")
	const pfx = "/recipes/mutex"
	s1, s2 := session(cli, 60), session(newClient(), 60)
	m1, m2 := concurrency.NewMutex(s1, pfx), concurrency.NewMutex(s2, pfx)

	must(m1.Lock(ctx), "s1 Lock")
	out("s1 Lock: ok at %s; key under the prefix: %v", rel(m1.Header().Revision), strings.HasPrefix(m1.Key(), pfx+"/"))
	out("s1 Lock again (held): %s", errName(m1.Lock(ctx)))
	out("s2 TryLock: %s", errName(m2.TryLock(ctx)))
	out("waiters after the failed TryLock: %d", count(pfx+"/"))
	for i, m := range []*concurrency.Mutex{m1, m2} {
		r, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("/recipes/mutex-guarded", fmt.Sprintf("s%d", i+1))).Commit()
		must(err, "Txn IsOwner")
		out("txn guarded by s%d's IsOwner: succeeded=%v", i+1, r.Succeeded)
	}
	out("guarded key: %s", get(cli, "/recipes/mutex-guarded"))
	must(m1.Unlock(ctx), "s1 Unlock")
	out("s1 Unlock: ok; s1 Unlock again: %s", errName(m1.Unlock(ctx)))
	out("s2 TryLock: %s at %s", errName(m2.TryLock(ctx)), rel(m2.Header().Revision))
	out("s1 TryLock: %s", errName(m1.TryLock(ctx)))
	must(m2.Unlock(ctx), "s2 Unlock")

	// contended Lock: s2 queues behind s1 and gets the lock on Unlock
	must(m1.Lock(ctx), "s1 Lock")
	ch := make(chan error, 1)
	go func() { ch <- m2.Lock(ctx) }()
	waitFor("s2 queued", func() bool { return count(pfx+"/") == 2 })
	_, done := result(ch, 300*time.Millisecond)
	out("s2 Lock while s1 holds it: blocked=%v", !done)
	r0 := curRev()
	must(m1.Unlock(ctx), "s1 Unlock")
	err, done := result(ch, 20*time.Second)
	expect(done, "s2 Lock did not return after s1's Unlock")
	out("s1 Unlock -> s2 Lock: %s, header %+d from the queueing", errName(err), m2.Header().Revision-r0)
	must(m2.Unlock(ctx), "s2 Unlock")

	// the holder's session lease expires: the waiter gets the lock
	s3 := session(newClient(), 2)
	m3 := concurrency.NewMutex(s3, pfx)
	must(m3.Lock(ctx), "s3 Lock")
	go func() { ch <- m2.Lock(ctx) }()
	waitFor("s2 queued behind s3", func() bool { return count(pfx+"/") == 2 })
	_, done = result(ch, 300*time.Millisecond)
	out("s2 Lock while s3 (TTL 2) holds it: blocked=%v", !done)
	r0 = curRev()
	s3.Orphan() // no more keepalives: the lease runs out
	t0 := time.Now()
	err, done = result(ch, 20*time.Second)
	expect(done, "s2 Lock did not return after s3's lease expired")
	expect(time.Since(t0) > 500*time.Millisecond, "s2 got the lock %v after s3 stopped its keepalives", time.Since(t0))
	out("s3's lease expired -> s2 Lock: %s, header %+d (the expiry's delete)", errName(err), m2.Header().Revision-r0)
	ttl, err := cli.TimeToLive(ctx, s3.Lease())
	must(err, "TimeToLive")
	out("s3's lease TTL after expiry: %d; waiters: %d", ttl.TTL, count(pfx+"/"))
	r, err := cli.Txn(ctx).If(m2.IsOwner()).Then(clientv3.OpPut("/recipes/mutex-guarded", "s2")).Commit()
	must(err, "Txn IsOwner")
	out("txn guarded by s2's IsOwner: succeeded=%v", r.Succeeded)
	must(m2.Unlock(ctx), "s2 Unlock")

	// sync.Locker
	l := concurrency.NewLocker(s1, pfx)
	l.Lock()
	out("Locker Lock: waiters %d", count(pfx+"/"))
	l.Unlock()
	out("Locker Unlock: waiters %d", count(pfx+"/"))
	must(s1.Close(), "s1 Close")
	must(s2.Close(), "s2 Close")
	out("end at %s", rel(curRev()))
}

// ------------------------------------------------------------- Election

func electionRecipe() {
	begin("election")
	const pfx = "/recipes/election"
	s1, s2, s3 := session(cli, 60), session(newClient(), 60), session(newClient(), 60)
	e1, e2, e3 := concurrency.NewElection(s1, pfx), concurrency.NewElection(s2, pfx), concurrency.NewElection(s3, pfx)
	_, err := e3.Leader(ctx)
	out("Leader before any campaign: %s", errName(err))
	out("Proclaim before campaigning: %s", errName(e1.Proclaim(ctx, "x")))
	octx, ocancel := context.WithCancel(ctx)
	obs := e3.Observe(octx)
	observe := func(what string) {
		select {
		case r, ok := <-obs:
			expect(ok, "Observe closed")
			out("Observe after %s: %s at %s", what, r.Kvs[0].Value, rel(r.Header.Revision))
		case <-time.After(20 * time.Second):
			fail("Observe saw nothing after %s", what)
		}
	}
	leader := func() {
		r, err := e3.Leader(ctx)
		if err != nil {
			out("Leader: %s", errName(err))
			return
		}
		out("Leader: %s (created %s, %d candidates)", r.Kvs[0].Value, rel(r.Kvs[0].CreateRevision), count(pfx+"/"))
	}

	must(e1.Campaign(ctx, "one"), "e1 Campaign")
	out("e1 Campaign: elected at %s, rev %s", rel(e1.Header().Revision), rel(e1.Rev()))
	observe("e1's campaign")
	leader()
	must(e1.Proclaim(ctx, "one-b"), "e1 Proclaim")
	observe("e1's proclaim")
	leader()

	ch := make(chan error, 1)
	go func() { ch <- e2.Campaign(ctx, "two") }()
	waitFor("e2 queued", func() bool { return count(pfx+"/") == 2 })
	_, done := result(ch, 300*time.Millisecond)
	out("e2 Campaign while e1 leads: blocked=%v", !done)
	leader()
	must(e1.Resign(ctx), "e1 Resign")
	err, done = result(ch, 20*time.Second)
	expect(done, "e2 not elected after e1 resigned")
	out("e1 Resign -> e2 Campaign: %s, rev %s", errName(err), rel(e2.Rev()))
	observe("e1's resignation")
	leader()
	out("e1 Proclaim after resigning: %s", errName(e1.Proclaim(ctx, "stale")))
	must(e2.Proclaim(ctx, "two-b"), "e2 Proclaim")
	observe("e2's proclaim")

	// e1 campaigns again behind e2; e2's session closes (its lease revoked)
	go func() { ch <- e1.Campaign(ctx, "one-again") }()
	waitFor("e1 queued", func() bool { return count(pfx+"/") == 2 })
	must(s2.Close(), "s2 Close")
	err, done = result(ch, 20*time.Second)
	expect(done, "e1 not elected after e2's session closed")
	out("e2's session closed -> e1 Campaign: %s", errName(err))
	observe("e2's session closing")
	leader()
	// a resumed election (another process knowing the key) can proclaim
	e1r := concurrency.ResumeElection(s1, pfx, e1.Key(), e1.Rev())
	must(e1r.Proclaim(ctx, "resumed"), "resumed Proclaim")
	observe("the resumed election's proclaim")
	must(e1r.Resign(ctx), "resumed Resign")
	_, err = e3.Leader(ctx)
	out("Leader after the last resignation: %s", errName(err))
	ocancel()
	for range obs { // drains until observe's goroutine closes it
	}
	must(s1.Close(), "s1 Close")
	must(s3.Close(), "s3 Close")
	out("end at %s", rel(curRev()))
}

// ------------------------------------------------------------------ STM

var isolations = []struct {
	name string
	iso  concurrency.Isolation
}{
	{"serializable-snapshot", concurrency.SerializableSnapshot},
	{"serializable", concurrency.Serializable},
	{"repeatable-read", concurrency.RepeatableReads},
	{"read-committed", concurrency.ReadCommitted},
}

func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	must(err, "a counter's value")
	return n
}

func stmRecipe() {
	begin("stm")
	other := newClient()
	const workers, each = 4, 8
	for _, is := range isolations {
		p := "/recipes/stm/" + is.name + "/"
		opt := concurrency.WithIsolation(is.iso)
		// concurrent increments: with conflict checks, no update is lost
		var wg sync.WaitGroup
		var mu sync.Mutex
		var attempts int
		errs := make(chan error, workers*each)
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				c := cli
				if g%2 == 1 {
					c = other
				}
				for i := 0; i < each; i++ {
					key := p + "counter"
					if is.iso == concurrency.ReadCommitted {
						key = fmt.Sprintf("%scounter-%d", p, g) // no conflict checks: one key each
					}
					_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
						mu.Lock()
						attempts++
						mu.Unlock()
						s.Get(p + "shared")
						s.Put(key, strconv.Itoa(atoi(s.Get(key))+1))
						return nil
					}, opt)
					errs <- err
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must(err, "NewSTM increment")
		}
		r, err := cli.Get(ctx, p+"counter", clientv3.WithPrefix())
		must(err, "Get counters")
		sum := 0
		for _, kv := range r.Kvs {
			sum += atoi(string(kv.Value))
		}
		expect(sum == workers*each, "%s: %d increments summed to %d", is.name, workers*each, sum)
		expect(attempts >= workers*each, "%s: %d attempts for %d commits", is.name, attempts, workers*each)
		out("%s: %d workers x %d increments on %d key(s): sum %d", is.name, workers, each, len(r.Kvs), sum)

		// concurrent transfers between accounts: the balances are the same
		// whatever the interleaving (under conflict checks)
		if is.iso != concurrency.ReadCommitted {
			const accounts = 5
			for a := 0; a < accounts; a++ {
				put(cli, fmt.Sprintf("%sacct/%d", p, a), "100")
			}
			errs := make(chan error, workers*each)
			for g := 0; g < workers; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < each; i++ {
						from, to, amt := (g+i)%accounts, (g+2*i+1)%accounts, 1+g+i
						if from == to {
							to = (to + 1) % accounts
						}
						fk, tk := fmt.Sprintf("%sacct/%d", p, from), fmt.Sprintf("%sacct/%d", p, to)
						_, err := concurrency.NewSTM(cli, func(s concurrency.STM) error {
							fv, tv := atoi(s.Get(fk)), atoi(s.Get(tk))
							s.Put(fk, strconv.Itoa(fv-amt))
							s.Put(tk, strconv.Itoa(tv+amt))
							return nil
						}, opt, concurrency.WithPrefetch(fk, tk))
						errs <- err
					}
				}(g)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				must(err, "NewSTM transfer")
			}
			r, err := cli.Get(ctx, p+"acct/", clientv3.WithPrefix())
			must(err, "Get accounts")
			var bal []string
			total := 0
			for _, kv := range r.Kvs {
				bal = append(bal, string(kv.Value))
				total += atoi(string(kv.Value))
			}
			expect(total == 100*accounts, "%s: transfers changed the total to %d", is.name, total)
			out("%s: %d concurrent transfers: balances %s (total %d)", is.name, workers*each, strings.Join(bal, " "), total)
		}

		// a forced conflict: another client writes the key the STM read
		// before it commits (once): retried when the isolation checks reads
		put(cli, p+"fc", "0")
		n := 0
		_, err = concurrency.NewSTM(cli, func(s concurrency.STM) error {
			n++
			v := s.Get(p + "fc")
			if n == 1 {
				put(other, p+"fc", "ext")
			}
			s.Put(p+"fc", v+"+stm")
			return nil
		}, opt)
		must(err, "NewSTM forced conflict")
		out("%s: read-write conflict: %d attempt(s), value %s", is.name, n, get(cli, p+"fc"))
		if is.iso != concurrency.ReadCommitted {
			expect(n >= 2, "%s: the forced conflict was not retried", is.name)
		}

		// a read after another client's write, within one attempt: from the
		// snapshot of the first read (serializable) or the newest
		put(cli, p+"a", "a1")
		put(cli, p+"b", "b1")
		n = 0
		var reads []string
		_, err = concurrency.NewSTM(cli, func(s concurrency.STM) error {
			n++
			va := s.Get(p + "a")
			if n == 1 {
				put(other, p+"b", "b2")
			}
			vb := s.Get(p + "b")
			reads = append(reads, va+","+vb)
			s.Put(p+"c", va+vb)
			return nil
		}, opt)
		must(err, "NewSTM snapshot read")
		out("%s: read after a write: attempts read %s; c=%s", is.name, strings.Join(reads, " then "), get(cli, p+"c"))

		// a blind write conflict: another client writes the key the STM
		// only writes: retried under serializable snapshot alone
		put(cli, p+"w", "w0")
		n = 0
		_, err = concurrency.NewSTM(cli, func(s concurrency.STM) error {
			n++
			s.Get(p + "a")
			if n == 1 {
				put(other, p+"w", "ext")
			}
			s.Put(p+"w", "stm")
			return nil
		}, opt)
		must(err, "NewSTM write conflict")
		out("%s: write-write conflict: %d attempt(s), value %s", is.name, n, get(cli, p+"w"))

		// apply's error aborts: nothing written
		_, err = concurrency.NewSTM(cli, func(s concurrency.STM) error {
			s.Put(p+"aborted", "x")
			return errors.New("abort")
		}, opt)
		out("%s: apply error: %v; key written: %v", is.name, err, get(cli, p+"aborted") != "<none>")
		// Del and Rev
		_, err = concurrency.NewSTM(cli, func(s concurrency.STM) error {
			if s.Rev(p+"a") == 0 || s.Rev(p+"nothing") != 0 {
				return errors.New("Rev")
			}
			s.Del(p + "a")
			return nil
		}, opt)
		must(err, "NewSTM Del")
		out("%s: Del: a=%s", is.name, get(cli, p+"a"))
	}
	other.Close()
}

// -------------------------------------------------------------- leasing

func leasingRecipe() {
	begin("leasing")
	const lp, p = "/recipes/leasing-owners/", "/recipes/leasing/"
	c1, c2 := newClient(), newClient()
	lkv1, close1, err := leasing.NewKV(c1, lp)
	must(err, "leasing.NewKV 1")
	lkv2, close2, err := leasing.NewKV(c2, lp)
	must(err, "leasing.NewKV 2")
	lget := func(kv clientv3.KV, key string) string {
		r, err := kv.Get(ctx, key)
		must(err, "leasing Get "+key)
		if len(r.Kvs) == 0 {
			return "<none>"
		}
		return string(r.Kvs[0].Value)
	}
	k := p + "k1"
	put(cli, k, "v1")
	out("lkv1 Get: %s; owner keys: %d", lget(lkv1, k), count(lp))
	put(cli, k, "raw") // around the leasing protocol: lkv1's cache is not told
	out("after a plain Put: lkv1 Get (cached) %s, plain Get %s", lget(lkv1, k), get(cli, k))
	out("lkv2 Get (lkv1 owns it): %s; owner keys: %d", lget(lkv2, k), count(lp))
	_, err = lkv2.Put(ctx, k, "v2")
	must(err, "lkv2 Put")
	out("lkv2 Put v2: lkv1 Get %s, lkv2 Get %s, plain Get %s", lget(lkv1, k), lget(lkv2, k), get(cli, k))
	_, err = lkv1.Delete(ctx, k)
	must(err, "lkv1 Delete")
	out("lkv1 Delete: lkv1 Get %s, lkv2 Get %s, plain Get %s", lget(lkv1, k), lget(lkv2, k), get(cli, k))
	_, err = lkv1.Put(ctx, k, "v3")
	must(err, "lkv1 Put")
	out("lkv1 Put v3: lkv2 Get %s, lkv1 Get %s", lget(lkv2, k), lget(lkv1, k))

	k = p + "k2"
	_, err = lkv1.Put(ctx, k, "t1")
	must(err, "lkv1 Put")
	out("k2: lkv1 Get %s; owner keys for k2: %d", lget(lkv1, k), count(lp+k))
	txn := func(kv clientv3.KV, who, want, val string) {
		r, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", want)).
			Then(clientv3.OpPut(k, val)).Else(clientv3.OpGet(k)).Commit()
		must(err, who+" Txn")
		s := fmt.Sprintf("%s Txn if k2=%s then put %s: succeeded=%v", who, want, val, r.Succeeded)
		if !r.Succeeded {
			s += fmt.Sprintf(", else get %s", r.Responses[0].GetResponseRange().Kvs[0].Value)
		}
		out("%s; lkv1 Get %s, lkv2 Get %s", s, lget(lkv1, k), lget(lkv2, k))
	}
	txn(lkv1, "lkv1", "t1", "t1b") // the owner
	txn(lkv2, "lkv2", "t1b", "t2") // the other: revokes lkv1's ownership
	txn(lkv2, "lkv2", "nope", "x")
	txn(lkv1, "lkv1", "t1", "x")
	r, err := lkv1.Get(ctx, p, clientv3.WithPrefix())
	must(err, "lkv1 Get prefix")
	var kvs []string
	for _, kv := range r.Kvs {
		kvs = append(kvs, strings.TrimPrefix(string(kv.Key), p)+"="+string(kv.Value))
	}
	out("lkv1 Get prefix: %s", strings.Join(kvs, " "))
	_, err = lkv2.Delete(ctx, p, clientv3.WithPrefix())
	must(err, "lkv2 Delete prefix")
	out("lkv2 Delete prefix: lkv1 Get k1 %s, k2 %s; keys %d", lget(lkv1, p+"k1"), lget(lkv1, p+"k2"), count(p))
	close1()
	close2()
	c1.Close()
	c2.Close()
}

// ------------------------------------------------------------- ordering

func orderingRecipe() {
	begin("ordering")
	violations := 0
	okv := ordering.NewKV(cli.KV, func(op clientv3.Op, resp clientv3.OpResponse, prevRev int64) error {
		violations++
		return fmt.Errorf("order violation: revision went back below %d", prevRev)
	})
	const p = "/recipes/ordering/"
	last := int64(0)
	for i := 0; i < 10; i++ {
		_, err := okv.Put(ctx, fmt.Sprintf("%s%d", p, i), strconv.Itoa(i))
		must(err, "ordering Put")
		put(cli, p+"other", strconv.Itoa(i))
		r, err := okv.Get(ctx, p, clientv3.WithPrefix())
		must(err, "ordering Get")
		expect(r.Header.Revision >= last, "revision went back")
		last = r.Header.Revision
		r, err = okv.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithSerializable(), clientv3.WithCountOnly())
		must(err, "ordering serializable Get")
		expect(r.Header.Revision >= last, "revision went back")
		last = r.Header.Revision
		t, err := okv.Txn(ctx).If(clientv3.Compare(clientv3.Value(p+"other"), "=", strconv.Itoa(i))).
			Then(clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
		must(err, "ordering Txn")
		expect(t.Succeeded && t.Header.Revision >= last, "ordering Txn")
		last = t.Header.Revision
		if i%3 == 0 {
			r, err = okv.Get(ctx, p+"0", clientv3.WithRev(base+1)) // an old revision: the header is current
			must(err, "ordering Get at an old revision")
			out("step %d: %d keys at %s; key 0 at the first revision: %d kv(s)", i, t.Responses[0].GetResponseRange().Count,
				rel(t.Header.Revision), len(r.Kvs))
		}
	}
	out("violations: %d", violations)
	expect(violations == 0, "the ordering KV saw the revision go back")
}

// --------------------------------------------------------------- mirror

func mirrorRecipe() {
	begin("mirror")
	const p = "/recipes/mirror/"
	for t := 0; t < 12; t++ { // more than one SyncBase batch (1000)
		var ops []clientv3.Op
		for i := 0; i < 100; i++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%04d", p, t*100+i), fmt.Sprintf("v%d", t*100+i)))
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		must(err, "mirror fill")
	}
	put(cli, "/recipes/mirror-outside", "x")
	src := newClient()
	s := mirror.NewSyncer(src, p, 0)
	respc, errc := s.SyncBase(ctx)
	// writes while the mirror syncs: puts, overwrites, deletes, a range delete
	writer := make(chan error, 1)
	go func() {
		w := newClient()
		defer w.Close()
		for i := 0; i < 40; i++ {
			var err error
			switch {
			case i < 15:
				_, err = w.Put(ctx, fmt.Sprintf("%snew%02d", p, i), "n")
			case i < 30:
				_, err = w.Put(ctx, fmt.Sprintf("%s%04d", p, i*7), "overwritten")
			case i < 39:
				_, err = w.Delete(ctx, fmt.Sprintf("%s%04d", p, 1000+i))
			default:
				_, err = w.Delete(ctx, p+"05", clientv3.WithPrefix()) // 0500..0599
			}
			if err != nil {
				writer <- err
				return
			}
			w.Put(ctx, "/recipes/mirror-outside", strconv.Itoa(i))
		}
		_, err := w.Put(ctx, p+"~done", "")
		writer <- err
	}()
	mirrored := map[string]string{}
	batches := 0
	for r := range respc {
		batches++
		for _, kv := range r.Kvs {
			mirrored[string(kv.Key)] = string(kv.Value)
		}
	}
	must(<-errc, "SyncBase")
	out("SyncBase: %d keys in %d batches", len(mirrored), batches)
	events := 0
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := s.SyncUpdates(wctx) // one watch from the base revision + 1
	for done := false; !done; {
		select {
		case wr, ok := <-wch:
			expect(ok, "SyncUpdates closed")
			must(wr.Err(), "SyncUpdates")
			for _, ev := range wr.Events {
				events++
				k := string(ev.Kv.Key)
				expect(strings.HasPrefix(k, p), "an event outside the prefix: %s", k)
				if ev.Type == mvccpb.PUT {
					mirrored[k] = string(ev.Kv.Value)
				} else {
					delete(mirrored, k)
				}
				done = done || k == p+"~done"
			}
		case <-time.After(20 * time.Second):
			fail("SyncUpdates: the writer's last put never came")
		}
	}
	must(<-writer, "writer")
	r, err := cli.Get(ctx, p, clientv3.WithPrefix())
	must(err, "Get source")
	same := len(r.Kvs) == len(mirrored)
	for _, kv := range r.Kvs {
		same = same && mirrored[string(kv.Key)] == string(kv.Value)
	}
	out("SyncUpdates: %d events; mirrored %d keys, source %d keys, equal=%v", events, len(mirrored), len(r.Kvs), same)
	expect(same, "the mirror differs from the source")
	src.Close()
}

// ------------------------------------------------------------ namespace

func namespaceRecipe() {
	begin("namespace")
	const ns = "/recipes/ns/"
	nkv := namespace.NewKV(cli.KV, ns)
	nw := namespace.NewWatcher(cli.Watcher, ns)
	nl := namespace.NewLease(cli.Lease, ns)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := nw.Watch(wctx, "a", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	wr := <-wch
	out("Watch a*: created=%v", wr.Created)
	put(cli, "/recipes/ns-outside/a1", "outside")
	_, err := nkv.Put(ctx, "a1", "x")
	must(err, "ns Put")
	r, err := nkv.Get(ctx, "a1")
	must(err, "ns Get")
	out("Put a1: ns Get key %s value %s; plain Get %s%s: %s", r.Kvs[0].Key, r.Kvs[0].Value, ns, "a1", get(cli, ns+"a1"))
	l, err := nl.Grant(ctx, 60)
	must(err, "ns Grant")
	_, err = nkv.Put(ctx, "a2", "y", clientv3.WithLease(l.ID))
	must(err, "ns Put with lease")
	ttl, err := nl.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
	must(err, "ns TimeToLive")
	var keys []string
	for _, k := range ttl.Keys {
		keys = append(keys, string(k))
	}
	out("lease: granted %d, attached keys %s", ttl.GrantedTTL, strings.Join(keys, ","))
	t, err := nkv.Txn(ctx).If(clientv3.Compare(clientv3.Value("a1"), "=", "x")).
		Then(clientv3.OpPut("a3", "z", clientv3.WithPrevKV()), clientv3.OpGet("a", clientv3.WithPrefix())).Commit()
	must(err, "ns Txn")
	keys = nil
	for _, kv := range t.Responses[1].GetResponseRange().Kvs {
		keys = append(keys, string(kv.Key)+"="+string(kv.Value))
	}
	out("Txn if a1=x then put a3, get a*: succeeded=%v, %s", t.Succeeded, strings.Join(keys, " "))
	r, err = nkv.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	must(err, "ns Get from key")
	keys = nil
	for _, kv := range r.Kvs {
		keys = append(keys, string(kv.Key))
	}
	out("Get from \"\" (the whole namespace): %s", strings.Join(keys, " "))
	d, err := nkv.Delete(ctx, "a", clientv3.WithPrefix(), clientv3.WithPrevKV())
	must(err, "ns Delete")
	keys = nil
	for _, kv := range d.PrevKvs {
		keys = append(keys, string(kv.Key))
	}
	out("Delete a*: %d deleted, prev %s; outside key: %s", d.Deleted, strings.Join(keys, " "), get(cli, "/recipes/ns-outside/a1"))
	var evs []string
	for len(evs) < 6 {
		select {
		case wr := <-wch:
			must(wr.Err(), "ns watch")
			for _, ev := range wr.Events {
				s := fmt.Sprintf("%s %s=%s", ev.Type, ev.Kv.Key, ev.Kv.Value)
				if ev.PrevKv != nil {
					s += fmt.Sprintf(" (prev %s=%s)", ev.PrevKv.Key, ev.PrevKv.Value)
				}
				evs = append(evs, s)
			}
		case <-time.After(20 * time.Second):
			fail("ns watch: %d events of 6", len(evs))
		}
	}
	for _, e := range evs {
		out("watch event: %s", e)
	}
	_, err = nl.Revoke(ctx, l.ID)
	must(err, "ns Revoke")
}

// ---------------------------------------------------- watch progress

func watchRecipe() {
	begin("watch")
	const p = "/recipes/watch/"
	for i := 0; i < 3; i++ {
		put(cli, fmt.Sprintf("%s%d", p, i), "v")
	}
	// a WatchList-like start: list, then watch from the list's revision
	// with progress notifications and a required leader
	lr, err := cli.Get(ctx, p, clientv3.WithPrefix())
	must(err, "list")
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(lr.Header.Revision+1),
		clientv3.WithProgressNotify(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	next := func(what string) clientv3.WatchResponse {
		select {
		case wr, ok := <-wch:
			expect(ok, "watch closed (%s)", what)
			must(wr.Err(), what)
			return wr
		case <-time.After(20 * time.Second):
			fail("nothing on the watch: %s", what)
		}
		return clientv3.WatchResponse{}
	}
	wr := next("created")
	out("list: %d keys at %s; watch from the next revision: created=%v", len(lr.Kvs), rel(lr.Header.Revision), wr.Created)
	// etcd 3.7 drops a progress request while a watcher waits for a
	// revision the store has not reached (progressIfSync)
	must(cli.RequestProgress(wctx), "RequestProgress")
	select {
	case wr := <-wch:
		out("RequestProgress before the start revision: answered (progress notify=%v at %s)", wr.IsProgressNotify(), rel(wr.Header.Revision))
	case <-time.After(500 * time.Millisecond):
		out("RequestProgress before the start revision: no answer")
	}
	put(cli, p+"1", "v2")
	wr = next("an event")
	for _, ev := range wr.Events {
		out("event: %s %s=%s prev=%s at %s", ev.Type, strings.TrimPrefix(string(ev.Kv.Key), p), ev.Kv.Value,
			ev.PrevKv.Value, rel(ev.Kv.ModRevision))
	}
	must(cli.RequestProgress(wctx), "RequestProgress")
	wr = next("progress")
	out("RequestProgress: progress notify=%v at %s, %d events", wr.IsProgressNotify(), rel(wr.Header.Revision), len(wr.Events))
	put(cli, "/recipes/watch-outside", "x") // moves the revision, no event here
	must(cli.RequestProgress(wctx), "RequestProgress")
	wr = next("progress")
	out("RequestProgress after an unwatched write: progress notify=%v at %s", wr.IsProgressNotify(), rel(wr.Header.Revision))
	// a second watcher on the same stream: both get the progress
	wch2 := cli.Watch(wctx, "/recipes/watch-outside", clientv3.WithCreatedNotify())
	wr2 := <-wch2
	out("second watcher on the stream: created=%v", wr2.Created)
	must(cli.RequestProgress(wctx), "RequestProgress")
	wr = next("progress")
	wr2 = <-wch2
	out("RequestProgress with two watchers: first %v at %s, second %v at %s", wr.IsProgressNotify(), rel(wr.Header.Revision),
		wr2.IsProgressNotify(), rel(wr2.Header.Revision))
	put(cli, p+"2", "v2")
	wr = next("an event")
	out("next response after that: %d event(s), progress notify=%v", len(wr.Events), wr.IsProgressNotify())
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: recipes HOST:PORT")
		os.Exit(2)
	}
	endpoint = os.Args[1]
	var cancel context.CancelFunc
	ctx, cancel = context.WithTimeout(context.Background(), 170*time.Second)
	defer cancel()
	time.AfterFunc(180*time.Second, func() { fail("the run took more than 180 s") })
	cli = newClient()
	begin("start")
	out("store revision %d", base)
	for _, f := range []func(){mutexRecipe, electionRecipe, stmRecipe, leasingRecipe, orderingRecipe, mirrorRecipe,
		namespaceRecipe, watchRecipe} {
		t := time.Now()
		f()
		fmt.Fprintf(os.Stderr, "recipes: %s took %.1f s\n", section, time.Since(t).Seconds())
	}
	begin("end")
	r, err := cli.Get(ctx, "/recipes/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	must(err, "Get all")
	var keys []string
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		if !strings.HasPrefix(k, "/recipes/mirror/") && !strings.HasPrefix(k, "/recipes/leasing-owners/") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out("mirror keys: %d; %d others (but the leasing owners):", count("/recipes/mirror/"), len(keys))
	for _, k := range keys {
		out("key %s", k)
	}
	cli.Close()
}
