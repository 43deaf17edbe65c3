package main

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.uber.org/zap"
)

type faultEnv struct {
	sc        scenario
	srv       server
	relay     *relay
	endpoints []string
	rng       *rand.Rand
	finish    chan struct{}
	wg        *sync.WaitGroup
	set       *client.ClientSet
}

// A fault: what one board can suffer.  setup runs before the server
// starts, during alongside the traffic, inject once about 1 s in.
type fault struct {
	name        string
	etcdToo     bool            // also run against etcd, the control
	traffic     string          // a traffic mix it needs ("" = alternate)
	mix         traffic.Traffic // a request mix it needs
	compactFast bool
	leases      bool // lease probes instead of the linearized traffic
	setup       func(p *proc) error
	during      func(ctx context.Context, e *faultEnv)
	inject      func(ctx context.Context, e *faultEnv) error
}

const pauseFor = 3 * time.Second // > the lease checker's TTL and the progress interval

var allFaults = []*fault{
	{name: "none", etcdToo: true},
	{name: "kill", etcdToo: true, inject: killRestart(syscall.SIGKILL)},
	{name: "powercut", inject: killRestart(syscall.SIGUSR2)},
	{name: "pause", etcdToo: true, inject: func(ctx context.Context, e *faultEnv) error {
		if err := e.srv.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(pauseFor)
		return e.srv.signal(syscall.SIGCONT)
	}},
	{name: "conn-reset", etcdToo: true, inject: func(ctx context.Context, e *faultEnv) error {
		for i := 0; i < 3; i++ {
			e.relay.reset()
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	}},
	{name: "defrag", etcdToo: true, setup: func(p *proc) error {
		if p.kind == "kvd" { // and the automatic log rewrite, often
			p.extra = []string{"--auto-rewrite-percent", "5", "--auto-rewrite-min-bytes", "4096"}
		}
		return nil
	}, during: defragLoop},
	{name: "compaction-race", etcdToo: true, traffic: "etcd", mix: traffic.EtcdDelete, compactFast: true},
	{name: "rewrite-crash", setup: func(p *proc) error {
		p.env = []string{"KVD_TEST_REWRITE_CRASH=" + []string{"slice:1", "synced", "renamed", "dirsynced", "switched"}[rand.Intn(5)]}
		return nil
	}, inject: func(ctx context.Context, e *faultEnv) error {
		c, err := clientv3.New(clientv3.Config{Endpoints: e.endpoints, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c.Defragment(dctx, e.endpoints[0])
		cancel()
		c.Close()
		return restartAfterExit(e, 10*time.Second)
	}},
	{name: "flush-crash", setup: func(p *proc) error {
		p.env = []string{fmt.Sprintf("KVD_TEST_FLUSH_CRASH=%s:%d", []string{"before-sync", "after-sync"}[rand.Intn(2)], 20+rand.Intn(60))}
		return nil
	}, inject: func(ctx context.Context, e *faultEnv) error { return restartAfterExit(e, 10*time.Second) }},
	{name: "slow-fsync", setup: func(p *proc) error {
		p.env = []string{"KVD_TEST_FSYNC_DELAY_MS=20"}
		return nil
	}, inject: killRestart(syscall.SIGUSR2)},
	// the Kubernetes mix: its failed writes are unique and patched away, where
	// the etcd mix's failed deletes and revokes under a long NOSPACE alarm
	// outgrow porcupine's search
	{name: "disk-full", traffic: "kubernetes", setup: mountSmall, inject: fillDisk},
	{name: "slow-watch", etcdToo: true, during: slowWatcher},
	{name: "lease-pause", etcdToo: true, leases: true, inject: func(ctx context.Context, e *faultEnv) error {
		if err := e.srv.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(pauseFor)
		return e.srv.signal(syscall.SIGCONT)
	}},
	{name: "lease-kill", etcdToo: true, leases: true, inject: killRestart(syscall.SIGKILL)},
	{name: "clock-step", leases: true, setup: fakeClock, inject: stepClock},
}

func selectFaults(only string) []*fault {
	if only == "" {
		return allFaults
	}
	var out []*fault
	for _, n := range strings.Split(only, ",") {
		found := false
		for _, f := range allFaults {
			if f.name == n {
				out = append(out, f)
				found = true
			}
		}
		if !found {
			fmt.Fprintf(os.Stderr, "robust: no fault %q (-list names them)\n", n)
			os.Exit(2)
		}
	}
	return out
}

func killRestart(sig syscall.Signal) func(ctx context.Context, e *faultEnv) error {
	return func(ctx context.Context, e *faultEnv) error {
		p := e.srv.(*proc)
		if p.kind == "etcd" && sig == syscall.SIGUSR2 {
			sig = syscall.SIGKILL
		}
		before, err := revisionOf(p)
		if err != nil {
			return err
		}
		if err := e.srv.signal(sig); err != nil {
			return err
		}
		if !e.srv.wait(30 * time.Second) {
			return fmt.Errorf("still running after %v", sig)
		}
		if !p.keepEnv {
			p.env = nil
		}
		return restartChecked(e, before)
	}
}

// Durability: a restarted server's revision is never below one a client
// was answered with before the crash.  The clients stay away (the relay
// holds them off) until that is checked: etcd's traffic panics on a
// revision that went back, and a violation is reported instead.
type violation struct{ guarantee, detail string }

func (v *violation) Error() string { return v.guarantee + ": " + v.detail }

func restartChecked(e *faultEnv, before int64) error {
	p := e.srv.(*proc)
	e.relay.hold(true)
	e.relay.reset()
	if err := e.srv.start(nil); err != nil {
		return err
	}
	after, err := revisionOf(p)
	if err != nil {
		return err
	}
	if after < before {
		return &violation{"durability (no acknowledged write lost: the revision never goes back)",
			fmt.Sprintf("revision %d answered before the crash, %d after the restart", before, after)}
	}
	e.relay.hold(false)
	return nil
}

// a crash point fires when the traffic reaches it; then start plainly
func restartAfterExit(e *faultEnv, d time.Duration) error {
	p := e.srv.(*proc)
	before, err := revisionOf(p) // 0 when it already crashed: the linearizability check still sees a lost write
	if err != nil && err != errExited {
		return err
	}
	if !e.srv.wait(d) {
		return fmt.Errorf("the crash point (%v) was not reached in %v", p.env, d)
	}
	p.env = nil
	return restartChecked(e, before)
}

func defragLoop(ctx context.Context, e *faultEnv) {
	c, err := e.set.NewClient(e.endpoints) // recorded: Defragment is in the history, never linearized
	if err != nil {
		return
	}
	for {
		select {
		case <-e.finish:
			return
		case <-time.After(200 * time.Millisecond):
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c.Defragment(dctx)
		cancel()
	}
}

// A watcher that reads slowly and stalls: the server must queue, pause or
// cancel it, never skip an event.  Recorded, so every guarantee applies.
func slowWatcher(ctx context.Context, e *faultEnv) {
	c, err := e.set.NewClient(e.endpoints)
	if err != nil {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := c.Watch(wctx, "", 1, true, true, true)
	t0 := time.Now()
	for {
		select {
		case <-e.finish:
			return
		case _, ok := <-w:
			if !ok {
				return
			}
		}
		if d := time.Since(t0); d > time.Second && d < 2500*time.Millisecond {
			time.Sleep(1500 * time.Millisecond) // a stall
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// disk-full: the data dir on a small tmpfs, filled and emptied.
func mountSmall(p *proc) error {
	if p.kind != "kvd" {
		return nil
	}
	return runCmd("mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", p.data)
}

func fillDisk(ctx context.Context, e *faultEnv) error {
	p := e.srv.(*proc)
	filler := filepath.Join(p.data, "filler")
	f, err := os.Create(filler)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	time.Sleep(300 * time.Millisecond)
	// free a little at a time, as an operator would, then disarm the alarm
	if err := os.Remove(filler); err != nil {
		return err
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: e.endpoints, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.AlarmDisarm(actx, &clientv3.AlarmMember{})
	return err
}

// clock-step: kvd under libfaketime with the monotonic clock left alone;
// the wall clock jumps an hour forward, then two hours back.
var libfaketime = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
}

func fakeClock(p *proc) error {
	if p.kind != "kvd" {
		return nil
	}
	for _, lib := range libfaketime {
		if _, err := os.Stat(lib); err == nil {
			ts := filepath.Join(p.dir, "faketime")
			if err := os.WriteFile(ts, []byte("+0\n"), 0o600); err != nil {
				return err
			}
			p.env = []string{"LD_PRELOAD=" + lib, "FAKETIME_TIMESTAMP_FILE=" + ts, "FAKETIME_NO_CACHE=1",
				"FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_DONT_RESET=1"}
			p.keepEnv = true
			return nil
		}
	}
	return fmt.Errorf("clock-step needs libfaketime (Debian: faketime)")
}

func stepClock(ctx context.Context, e *faultEnv) error {
	ts := filepath.Join(e.srv.(*proc).dir, "faketime")
	if err := os.WriteFile(ts, []byte("+3600\n"), 0o600); err != nil {
		return err
	}
	time.Sleep(time.Second)
	return os.WriteFile(ts, []byte("-3600\n"), 0o600)
}
