package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.uber.org/zap"
)

// One server process on a fresh data dir: kvd's test build or etcd.
type server interface {
	name() string
	dataDir() string
	addr() string
	start(extraEnv []string) error
	signal(sig syscall.Signal) error
	wait(d time.Duration) bool // true if the process ended within d
	ensureRunning() error      // restart (plain) if a fault or a crash point ended it
	persisted() ([]model.EtcdRequest, error)
	destroy()
}

type proc struct {
	kind, bin, dir, data string
	port, peer           int
	cmd                  *exec.Cmd
	done                 chan struct{}
	mu                   sync.Mutex
	log                  *os.File
	wrap                 []string // a command the server runs under
	env, extra           []string // a fault's environment and flags for the next start
	keepEnv              bool     // ... and for every restart (a faked clock)
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newServer(sc scenario, dir string) (server, error) {
	p := &proc{kind: sc.server, dir: dir, data: filepath.Join(dir, "data"), port: freePort(), peer: freePort()}
	switch sc.server {
	case "kvd":
		p.bin = *kvdBin
	case "etcd":
		p.bin = *etcdBin
	}
	if err := os.MkdirAll(p.data, 0o700); err != nil {
		return nil, err
	}
	if sc.fault.setup != nil {
		if err := sc.fault.setup(p); err != nil {
			return nil, err
		}
	}
	var err error
	p.log, err = os.Create(filepath.Join(dir, "server.log"))
	return p, err
}

func (p *proc) name() string    { return p.kind }
func (p *proc) dataDir() string { return p.data }
func (p *proc) addr() string    { return fmt.Sprintf("127.0.0.1:%d", p.port) }
func (p *proc) history() string { return filepath.Join(p.dir, "history") }

func (p *proc) start(extraEnv []string) error {
	url := "http://" + p.addr()
	var args []string
	switch p.kind {
	case "kvd":
		args = []string{"--data-dir", p.data, "--listen-client-urls", url, "--advertise-client-urls", url,
			"--watch-progress-notify-interval", "100ms"}
	case "etcd":
		peer := fmt.Sprintf("http://127.0.0.1:%d", p.peer)
		args = []string{"--data-dir", p.data, "--listen-client-urls", url, "--advertise-client-urls", url,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default=" + peer, "--watch-progress-notify-interval", "100ms"}
	}
	args = append(args, p.extra...)
	argv := append(append([]string{}, p.wrap...), p.bin)
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "KVD_TEST_HISTORY="+p.history(), "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0")
	cmd.Env = append(cmd.Env, p.env...)
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if *verbose {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(p.log, os.Stderr), io.MultiWriter(p.log, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return p.ready(done)
}

// ready: a linearizable Get answers (the store replayed, the port open).
func (p *proc) ready(done chan struct{}) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{p.addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("%s exited at start (see %s)", p.kind, p.log.Name())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err = c.Get(ctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready: %v", p.kind, err)
}

func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return errExited
	}
	return p.cmd.Process.Signal(sig)
}

func (p *proc) wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select { // an exited process first: select picks at random among ready cases
	case <-done:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func (p *proc) ensureRunning() error {
	if !p.wait(0) {
		return nil
	}
	if !p.keepEnv {
		p.env = nil
	}
	return p.start(nil)
}

func (p *proc) destroy() {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
	p.log.Close()
	if p.kind == "kvd" && isMount(p.data) {
		syscall.Unmount(p.data, syscall.MNT_DETACH)
	}
}

func isMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	return err == nil && strings.Contains(string(b), " "+dir+" ")
}

// What the server persisted, as etcd's model requests: etcd's WAL, or the
// history kvd's log path wrote (KVD_TEST_HISTORY, see kvd.c section 10).
func (p *proc) persisted() ([]model.EtcdRequest, error) {
	if p.kind == "etcd" {
		return report.PersistedRequests(zap.NewNop(), []string{p.data})
	}
	return readHistory(p.history())
}

func unhex(s string) (string, error) {
	if s == "-" {
		return "", nil
	}
	b, err := hex.DecodeString(s)
	return string(b), err
}

func readHistory(path string) ([]model.EtcdRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []model.EtcdRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		fl := strings.Fields(sc.Text())
		bad := fmt.Errorf("%s:%d: bad line %q", path, n, sc.Text())
		if len(fl) < 5 {
			return nil, bad
		}
		num := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
		switch fl[3] {
		case "G":
			out = append(out, model.EtcdRequest{Type: model.LeaseGrant, LeaseGrant: &model.LeaseGrantRequest{LeaseID: num(fl[4])}})
		case "R":
			out = append(out, model.EtcdRequest{Type: model.LeaseRevoke, LeaseRevoke: &model.LeaseRevokeRequest{LeaseID: num(fl[4])}})
		case "C":
			out = append(out, model.EtcdRequest{Type: model.Compact, Compact: &model.CompactRequest{Revision: num(fl[4])}})
		case "T":
			txn := &model.TxnRequest{}
			for i := 4; i < len(fl); {
				switch {
				case fl[i] == "P" && i+3 < len(fl):
					k, e1 := unhex(fl[i+1])
					v, e2 := unhex(fl[i+2])
					if e1 != nil || e2 != nil {
						return nil, bad
					}
					txn.OperationsOnSuccess = append(txn.OperationsOnSuccess, model.EtcdOperation{Type: model.PutOperation,
						Put: model.PutOptions{Key: k, Value: model.ToValueOrHash(v), LeaseID: num(fl[i+3])}})
					i += 4
				case fl[i] == "D" && i+1 < len(fl):
					k, e1 := unhex(fl[i+1])
					if e1 != nil {
						return nil, bad
					}
					txn.OperationsOnSuccess = append(txn.OperationsOnSuccess, model.EtcdOperation{Type: model.DeleteOperation,
						Delete: model.DeleteOptions{Key: k}})
					i += 2
				default:
					return nil, bad
				}
			}
			out = append(out, model.EtcdRequest{Type: model.Txn, Txn: txn})
		default:
			return nil, bad
		}
	}
	return out, sc.Err()
}

// A TCP relay between the clients and the server, so a fault can cut every
// connection mid-stream with a reset (SO_LINGER 0), as a flaky link would.
type relay struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	held   bool // new connections refused (the server is being looked at alone)
}

func (r *relay) hold(on bool) {
	r.mu.Lock()
	r.held = on
	r.mu.Unlock()
}

func newRelay(target string) (*relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{l: l, target: target, conns: map[net.Conn]struct{}{}}
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.l.Addr().String() }

func (r *relay) serve() {
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		held := r.held
		r.mu.Unlock()
		if held {
			c.Close()
			continue
		}
		go func() {
			s, err := net.DialTimeout("tcp", r.target, 2*time.Second)
			if err != nil {
				c.Close()
				return
			}
			r.mu.Lock()
			r.conns[c], r.conns[s] = struct{}{}, struct{}{}
			r.mu.Unlock()
			var once sync.Once
			end := func() {
				once.Do(func() {
					c.Close()
					s.Close()
					r.mu.Lock()
					delete(r.conns, c)
					delete(r.conns, s)
					r.mu.Unlock()
				})
			}
			go func() { io.Copy(s, c); end() }()
			io.Copy(c, s)
			end()
		}()
	}
}

// reset every connection now: RST both ways.
func (r *relay) reset() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for c := range r.conns {
		if t, ok := c.(*net.TCPConn); ok {
			t.SetLinger(0)
		}
		c.Close()
		n++
	}
	return n / 2
}

func (r *relay) close() { r.l.Close(); r.reset() }

// The server's revision, asked directly (not through the relay); errExited
// as soon as the process is gone (a crash point fired meanwhile).
func revisionOf(p *proc) (int64, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{p.addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var last error
	for i := 0; i < 50; i++ {
		if p.wait(0) {
			return 0, errExited
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := c.Get(ctx, "health")
		cancel()
		if err == nil {
			return r.Header.Revision, nil
		}
		last = err
	}
	return 0, last
}
