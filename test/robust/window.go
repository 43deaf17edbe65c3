package main

// Where a violation is.  etcd's validators say which guarantee broke; this
// file says where, so that a failure can be read without the whole history:
//
//   - the validators' own error entries (client, revision, key, the events
//     or responses they compared), which etcd logs and robust otherwise
//     discards, captured by a second validation pass;
//   - for a linearizability failure, the shortest failing prefix: the
//     earliest instant T such that the operations called by T, with those
//     still in flight at T made "unknown" (they may or may not take effect,
//     as a failed request), are already not linearizable.  The operation
//     that returned at T is the one the history cannot explain; the window
//     printed is it and the operations around it, and the prefix's own
//     porcupine picture is saved as window.html.
//
// The search is sound because cutting at T only drops constraints: in any
// linearization of the whole history, every operation returned by T is
// ordered before every operation called after T, so restricting it to the
// prefix is a linearization of the prefix.  A prefix that fails therefore
// pins a real violation, and failure is monotone in T, so bisection finds
// the earliest T over the operations' return instants.

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
)

type window struct {
	lines     []string                // printed under the violation
	visualize func(path string) error // the failing prefix's picture, or nil
}

const (
	windowOps      = 10               // operations printed around the failing one
	windowEntry    = 500              // bytes kept of each validator entry
	windowBudget   = 90 * time.Second // for the whole prefix search
	windowPerCheck = 20 * time.Second
)

func locate(cfg validate.Config, reports []report.ClientReport, persisted []model.EtcdRequest) window {
	var w window
	var buf bytes.Buffer
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey, enc.CallerKey, enc.StacktraceKey = "", "", ""
	lg := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&buf), zapcore.ErrorLevel))
	res := validate.ValidateAndReturnVisualize(lg, cfg, reports, persisted, 2*time.Minute)
	n := 0
	for _, l := range strings.Split(buf.String(), "\n") {
		if l == "" || strings.Contains(l, "validation failed") || strings.Contains(l, "Linearization illegal") {
			continue
		}
		if n++; n > 5 {
			w.lines = append(w.lines, "(more entries: see the report)")
			break
		}
		if len(l) > windowEntry {
			l = l[:windowEntry] + "..."
		}
		w.lines = append(w.lines, "at: "+l)
	}
	if res.Linearization.Error() == nil {
		return w
	}
	lines, vis := shortestFailingPrefix(cfg, reports, persisted)
	w.lines = append(w.lines, lines...)
	w.visualize = vis
	return w
}

// cut: the reports as they stood at T (nanoseconds, the clients' clock).
func cut(reports []report.ClientReport, t int64) []report.ClientReport {
	out := make([]report.ClientReport, len(reports))
	for i, r := range reports {
		out[i] = report.ClientReport{ClientID: r.ClientID, Watch: r.Watch}
		for _, op := range r.KeyValue {
			if op.Call > t {
				continue
			}
			if op.Return > t {
				op.Output = model.MaybeEtcdResponse{Error: "in flight at the cut"}
				op.Return = math.MaxInt64
			}
			out[i].KeyValue = append(out[i].KeyValue, op)
		}
	}
	return out
}

func shortestFailingPrefix(cfg validate.Config, reports []report.ClientReport, persisted []model.EtcdRequest) ([]string, func(string) error) {
	var ops []porcupine.Operation
	for _, r := range reports {
		ops = append(ops, r.KeyValue...)
	}
	var ends []int64
	for _, op := range ops {
		if op.Output.(model.MaybeEtcdResponse).Error == "" {
			ends = append(ends, op.Return)
		}
	}
	slices.Sort(ends)
	ends = slices.Compact(ends)
	if len(ends) == 0 {
		return nil, nil
	}
	start := time.Now()
	var last validate.LinearizationResult
	fails := func(t int64) (bool, bool) {
		if time.Since(start) > windowBudget {
			return false, false
		}
		r := validate.ValidateAndReturnVisualize(zap.NewNop(), cfg, cut(reports, t), persisted, windowPerCheck)
		if r.Linearization.Status == validate.Failure {
			last = r.Linearization
			return true, true
		}
		return false, r.Linearization.Status == validate.Success
	}
	// invariant: the prefix at ends[hi] fails (the whole history does);
	// those at ends[<lo] were shown linearizable
	lo, hi := 0, len(ends)-1
	exact := true
	if f, _ := fails(ends[hi]); !f {
		return []string{"window: the failure does not reproduce on the history's own prefix (linearization timed out?)"}, nil
	}
	for lo < hi {
		mid := (lo + hi) / 2
		f, decided := fails(ends[mid])
		if !decided && !f {
			exact = false
		}
		if f {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	t := ends[hi]
	if f, _ := fails(t); !f { // keep the picture of the prefix reported
		exact = false
	}
	in := cut(reports, t)
	var pre []porcupine.Operation
	for _, r := range in {
		pre = append(pre, r.KeyValue...)
	}
	slices.SortFunc(pre, func(a, b porcupine.Operation) int { // in flight (MaxInt64) last
		if c := cmp.Compare(a.Return, b.Return); c != 0 {
			return c
		}
		return cmp.Compare(a.Call, b.Call)
	})
	how := "shortest"
	if !exact {
		how = "a short (search cut short by timeouts)"
	}
	lines := []string{fmt.Sprintf("window: %s failing prefix: %d of %d operations, to t=%.3fs; "+
		"the operation marked > returned at its end and cannot be explained:", how, len(pre), len(ops), float64(t)/1e9)}
	m := model.NonDeterministicModel(model.ModelKeys(pre))
	from := 0
	for i, op := range pre {
		if op.Return == t {
			from = max(0, i-windowOps+1)
		}
	}
	for i := from; i < len(pre) && i < from+windowOps+4; i++ {
		op := pre[i]
		mark := " "
		if op.Return == t {
			mark = ">"
		}
		ret := "  in flight "
		if op.Return != math.MaxInt64 {
			ret = fmt.Sprintf("%9.3fs", float64(op.Return)/1e9)
		}
		lines = append(lines, fmt.Sprintf("  %s client %-3d %9.3fs..%s  %s", mark, op.ClientId,
			float64(op.Call)/1e9, ret, m.DescribeOperation(op.Input, op.Output)))
	}
	vis := func(path string) error { return porcupine.VisualizePath(last.Model, last.Info, path) }
	if last.Model.Step == nil {
		vis = nil
	}
	return lines, vis
}
