/*
 * test/fuzz_embed.c - libFuzzer target: a program of in-process calls
 * (kvd.h) against one instance without a listener, checked against a model
 * of the store.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Each input is a program: an op byte, then its arguments.  Put, delete,
 * cas, get (now or at an old revision), get_prefix (with a limit) on four
 * keys and short values; lease grant and revoke (ids 1, 2) and puts on
 * them; watches opened (a key, a prefix, everything; now or from an old
 * revision; prev_kv) and cancelled, from the program or from inside a
 * callback (the watch's own, or the next callback of any call); a put
 * started from inside the next callback; loop turns (kvd_pollfds, poll 0,
 * kvd_process).  A fresh store per input.  The model is a map key ->
 * (value, create, mod, version, lease) at each revision, advanced by the
 * completion callbacks, which come in commit order: a write's revision is
 * the model's plus one (or the same when it changes nothing), a get
 * answers what the model held at its revision, a cas succeeds iff the
 * model's mod_revision matches, prev_kv is the model's; each watch's
 * events are, revision by revision, whole and in order, the model's
 * writes in its range from its start on (all of them for a watch still
 * open at the end).  Every call gets exactly one last callback (the
 * instance closed: the open watches' come from kvd_close), none from
 * inside a kvd_* call, nothing after it; nothing leaks (kvd_close checks
 * k->mem under KVD_CHECKS).  Any mismatch aborts.
 */
#define KVD_NO_MAIN
#include "../kvd.c"
#include "lib/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_NK 4
#define FZ_MAXREV 1024
#define FZ_MAXOPS 1024
#define FZ_MAXW 8
#define FZ_MAXEV 512
#define FZ_CHECK(x) ((x) ? (void)0 : fz_fail(#x, __LINE__))

static const char *fz_keys[FZ_NK] = {"a0", "a1", "b0", "b1"}; /* in key order */

struct fz_key {
	int live;
	uint8_t val[2];
	int64_t create, mod, ver, lease;
};

struct fz_ev { /* one event, as the model made it or a watch saw it */
	int64_t rev;
	int key, del;
	struct fz_key kv, prev; /* prev.live: there was one before */
};

enum { OP_PUT, OP_DEL, OP_CAS, OP_GET, OP_PREFIX, OP_WATCH, OP_GRANT, OP_REVOKE, OP_NOPE };

struct fz_op {
	int kind, key, sel, val;
	int64_t lease, arg, issued; /* cas: the mod_revision; get: the revision asked; issued: model rev then */
	int finals, code;
	/* watches */
	struct kvd_stream *s;
	unsigned flags;
	int64_t start;
	int cancel_req, cancel_in_cb, put_in_cb, nev, over;
	struct fz_ev *ev;
};

static struct {
	struct kvd *k;
	struct fz_key st[FZ_MAXREV][FZ_NK]; /* the keys at each revision */
	int64_t rev, base;
	int leases[3];
	struct fz_ev hist[FZ_MAXREV * 2];
	int nhist;
	struct fz_op ops[FZ_MAXOPS];
	int nops;
	int w[FZ_MAXW], nw; /* watches: indexes into ops */
	struct fz_ev evs[FZ_MAXW][FZ_MAXEV];
	int inside;        /* a kvd_* entry runs: no callback now */
	int pending_put;   /* the next callback puts */
	int pending_cancel; /* the next callback cancels this watch (1-based) */
	int closing;
} M;

static void fz_fail(const char *what, int line)
{
	fprintf(stderr, "fuzz_embed: line %d: %s (model rev %lld)\n", line, what, (long long)M.rev);
	abort();
}

static int fz_key_of(const void *p, size_t n)
{
	int i;

	for (i = 0; i < FZ_NK; i++)
		if (n == 2 && !memcmp(p, fz_keys[i], 2))
			return i;
	fz_fail("a key the program never wrote", __LINE__);
	return -1;
}

/* Does watch range sel (0..3 one key, 4 "a", 5 "b", 6 everything) hold key? */
static int fz_in(int sel, int key)
{
	return sel < 4 ? sel == key : sel == 6 || (sel == 4) == (key < 2);
}

static void fz_kv_is(const struct kvd_kv *kv, const struct fz_key *m, int key)
{
	FZ_CHECK(m->live);
	FZ_CHECK(fz_key_of(kv->key, kv->key_len) == key);
	FZ_CHECK(kv->value_len == 2 && !memcmp(kv->value, m->val, 2));
	FZ_CHECK(kv->create_revision == m->create && kv->mod_revision == m->mod && kv->version == m->ver);
	FZ_CHECK(kv->lease == m->lease);
}

/* A new revision: the model's keys as they are now, and its events. */
static void fz_commit(void)
{
	FZ_CHECK(M.rev + 1 < M.base + FZ_MAXREV);
	M.rev++;
	memcpy(M.st[M.rev - M.base], M.st[M.rev - 1 - M.base], sizeof M.st[0]);
}

static void fz_write(int key, int del, const uint8_t *val, int64_t lease)
{
	struct fz_key *c = &M.st[M.rev - M.base][key];
	struct fz_ev *e;

	FZ_CHECK(M.nhist < (int)KVD_COUNT(M.hist));
	e = &M.hist[M.nhist++];

	e->rev = M.rev;
	e->key = key;
	e->del = del;
	e->prev = M.st[M.rev - 1 - M.base][key];
	if (del) {
		memset(c, 0, sizeof *c);
	} else {
		if (!c->live)
			c->create = M.rev, c->ver = 0;
		c->live = 1;
		c->ver++;
		c->mod = M.rev;
		c->lease = lease;
		memcpy(c->val, val, 2);
	}
	e->kv = *c;
	e->kv.mod = M.rev;
}

static struct fz_op *fz_new(int kind)
{
	struct fz_op *o;

	if (M.nops >= FZ_MAXOPS)
		return NULL;
	o = &M.ops[M.nops++];
	memset(o, 0, sizeof *o);
	o->kind = kind;
	o->issued = M.rev;
	return o;
}

static void fz_put(int key, int val, int64_t lease);

/* What every callback does first: not inside a kvd_* entry, not after the
 * last; then what the program asked of "the next callback". */
static void fz_enter(struct fz_op *o)
{
	FZ_CHECK(!M.inside);
	FZ_CHECK(!o->finals);
	if (M.closing)
		return; /* kvd_close ends what is open: no new call now */
	if (M.pending_put) {
		M.pending_put = 0;
		fz_put(M.rev & 3, 'P', 0);
	}
	if (M.pending_cancel) {
		struct fz_op *w = &M.ops[M.w[M.pending_cancel - 1]];
		M.pending_cancel = 0;
		if (!w->finals && w->s) {
			M.inside++;
			kvd_stream_cancel(w->s);
			M.inside--;
			w->cancel_req = 1;
		}
	}
}

static void fz_result(void *arg, const struct kvd_result *r)
{
	struct fz_op *o = arg;
	struct fz_key *cur;
	int64_t at;
	int i, n, more;
	uint8_t v[2];

	fz_enter(o);
	o->finals++;
	o->code = r->code;
	cur = M.st[M.rev - M.base];
	switch (o->kind) {
	case OP_PUT:
		if (o->lease && !M.leases[o->lease]) {
			FZ_CHECK(r->code == GRPC_NOT_FOUND && !strcmp(r->text, E_LEASE_NOT_FOUND));
			break;
		}
		FZ_CHECK(r->code == 0 && !*r->text);
		FZ_CHECK(r->revision == M.rev + 1);
		FZ_CHECK(r->count == (size_t)cur[o->key].live);
		if (r->count)
			fz_kv_is(&r->kvs[0], &cur[o->key], o->key);
		fz_commit();
		v[0] = 'v';
		v[1] = (uint8_t)o->val;
		fz_write(o->key, 0, v, o->lease);
		break;
	case OP_DEL:
		FZ_CHECK(r->code == 0);
		FZ_CHECK(r->total == cur[o->key].live && r->count == (size_t)cur[o->key].live);
		FZ_CHECK(r->revision == M.rev + cur[o->key].live);
		if (!cur[o->key].live)
			break;
		fz_kv_is(&r->kvs[0], &cur[o->key], o->key);
		fz_commit();
		fz_write(o->key, 1, NULL, 0);
		break;
	case OP_CAS:
		FZ_CHECK(r->code == 0);
		FZ_CHECK(r->succeeded == (cur[o->key].mod == o->arg)); /* mod 0: absent */
		if (!r->succeeded) {
			FZ_CHECK(r->revision == M.rev && r->count == (size_t)cur[o->key].live);
			if (r->count)
				fz_kv_is(&r->kvs[0], &cur[o->key], o->key);
			break;
		}
		FZ_CHECK(r->revision == M.rev + 1);
		fz_commit();
		v[0] = 'c';
		v[1] = (uint8_t)o->val;
		fz_write(o->key, 0, v, 0);
		break;
	case OP_GET:
	case OP_PREFIX:
		FZ_CHECK(r->code == 0);
		/* it saw every write answered before it was made, none not answered yet */
		FZ_CHECK(r->revision >= o->issued && r->revision <= M.rev);
		at = o->arg ? o->arg : r->revision;
		FZ_CHECK(at >= M.base && at <= M.rev);
		for (i = n = 0; i < FZ_NK; i++)
			n += (o->kind == OP_GET ? i == o->key : fz_in(o->sel, i)) && M.st[at - M.base][i].live;
		more = o->kind == OP_PREFIX && o->lease && n > o->lease;
		FZ_CHECK(r->total == n && r->more == more);
		FZ_CHECK(r->count == (size_t)(more ? o->lease : n));
		for (i = n = 0; i < FZ_NK && (size_t)n < r->count; i++)
			if ((o->kind == OP_GET ? i == o->key : fz_in(o->sel, i)) && M.st[at - M.base][i].live)
				fz_kv_is(&r->kvs[n++], &M.st[at - M.base][i], i);
		break;
	case OP_GRANT:
		if (M.leases[o->lease]) {
			FZ_CHECK(r->code == GRPC_FAILED_PRECONDITION && !strcmp(r->text, E_LEASE_EXISTS));
			break;
		}
		FZ_CHECK(r->code == 0 && r->lease == o->lease && r->ttl == 3600 && r->revision == M.rev);
		M.leases[o->lease] = 1;
		break;
	case OP_REVOKE:
		if (!M.leases[o->lease]) {
			FZ_CHECK(r->code == GRPC_NOT_FOUND && !strcmp(r->text, E_LEASE_NOT_FOUND));
			break;
		}
		FZ_CHECK(r->code == 0);
		M.leases[o->lease] = 0;
		for (i = n = 0; i < FZ_NK; i++)
			n += cur[i].live && cur[i].lease == o->lease;
		FZ_CHECK(r->revision == M.rev + (n > 0));
		if (!n)
			break;
		fz_commit();
		for (i = 0; i < FZ_NK; i++)
			if (M.st[M.rev - 1 - M.base][i].live && M.st[M.rev - 1 - M.base][i].lease == o->lease)
				fz_write(i, 1, NULL, 0);
		break;
	default:
		fz_fail("a result for no typed call", __LINE__);
	}
}

static int fz_reply(void *arg, const struct kvd_reply *r)
{
	struct fz_op *o = arg;

	fz_enter(o);
	FZ_CHECK(r->last); /* an unknown method: only its end */
	o->finals++;
	FZ_CHECK(r->code == GRPC_UNIMPLEMENTED);
	return 0;
}

static int fz_watch_cb(void *arg, const struct kvd_events *e)
{
	struct fz_op *o = arg;
	size_t i;
	int cancelled = o->cancel_req; /* before this callback */

	fz_enter(o);
	if (e->last) {
		o->finals++;
		o->code = e->code;
		if (o->cancel_req)
			FZ_CHECK(e->code == GRPC_CANCELLED && !strcmp(e->text, "context canceled"));
		else
			FZ_CHECK(e->code == GRPC_UNAVAILABLE && !strcmp(e->text, "etcdserver: server stopped"));
		return 0;
	}
	FZ_CHECK(!cancelled); /* no message after kvd_stream_cancel returned */
	FZ_CHECK(!e->progress || !e->count);
	for (i = 0; i < e->count; i++) {
		const struct kvd_event *v = &e->ev[i];
		struct fz_ev *s;
		if (o->nev == FZ_MAXEV) {
			o->over = 1;
			break;
		}
		s = &o->ev[o->nev++];
		memset(s, 0, sizeof *s);
		s->rev = v->kv.mod_revision;
		s->key = fz_key_of(v->kv.key, v->kv.key_len);
		s->del = v->type == KVD_EVENT_DELETE;
		FZ_CHECK(fz_in(o->sel, s->key) && s->rev >= o->start);
		if (!s->del) {
			s->kv.live = 1;
			FZ_CHECK(v->kv.value_len == 2);
			memcpy(s->kv.val, v->kv.value, 2);
			s->kv.create = v->kv.create_revision;
			s->kv.ver = v->kv.version;
			s->kv.lease = v->kv.lease;
		}
		s->kv.mod = s->rev;
		FZ_CHECK(!v->prev || (o->flags & KVD_WATCH_PREV_KV));
		if (v->prev) {
			FZ_CHECK(v->prev->value_len == 2 && fz_key_of(v->prev->key, v->prev->key_len) == s->key);
			s->prev.live = 1;
			memcpy(s->prev.val, v->prev->value, 2);
			s->prev.create = v->prev->create_revision;
			s->prev.mod = v->prev->mod_revision;
			s->prev.ver = v->prev->version;
			s->prev.lease = v->prev->lease;
		}
		/* in revision order, each (revision, key) once */
		FZ_CHECK(o->nev < 2 || s->rev > s[-1].rev || (s->rev == s[-1].rev && s->key != s[-1].key));
	}
	if (o->cancel_in_cb) {
		o->cancel_in_cb = 0;
		M.inside++;
		kvd_stream_cancel(o->s);
		kvd_stream_cancel(o->s); /* twice: once counts */
		M.inside--;
		o->cancel_req = 1;
	}
	if (o->put_in_cb && !M.closing) {
		o->put_in_cb = 0;
		fz_put(o->key, 'w', 0);
	}
	return 0;
}

static void fz_started(struct fz_op *o, int rc)
{
	FZ_CHECK(rc == 0); /* no failing allocator here: every call starts */
	(void)o;
}

static void fz_put(int key, int val, int64_t lease)
{
	struct fz_op *o = fz_new(OP_PUT);
	uint8_t v[2] = {'v', (uint8_t)val};

	if (!o)
		return;
	o->key = key;
	o->val = val;
	o->lease = lease;
	M.inside++;
	fz_started(o, kvd_put(M.k, fz_keys[key], 2, v, 2, lease, fz_result, o));
	M.inside--;
}

static void fz_turns(int n)
{
	struct pollfd fds[16];
	int i, m, t;

	for (i = 0; i < n; i++) {
		if ((m = kvd_pollfds(M.k, fds, 16, &t)) < 0 || m > 16)
			fz_fail("kvd_pollfds", __LINE__);
		if (poll(fds, (nfds_t)m, 0) < 0)
			fz_fail("poll", __LINE__);
		if (kvd_process(M.k, fds, m))
			fz_fail("kvd_process", __LINE__);
	}
}

/* Everything the program started, answered (the watches aside)? */
static int fz_idle(void)
{
	int i;

	for (i = 0; i < M.nops; i++)
		if (M.ops[i].kind != OP_WATCH && !M.ops[i].finals)
			return 0;
	return 1;
}

static int fz_ev_cmp(const void *a, const void *b)
{
	const struct fz_ev *x = a, *y = b;

	return x->rev != y->rev ? (x->rev < y->rev ? -1 : 1) : x->key - y->key;
}

static int fz_key_eq(const struct fz_key *a, const struct fz_key *b, int full)
{
	if (a->live != b->live)
		return 0;
	if (!a->live)
		return 1;
	return !memcmp(a->val, b->val, 2) && a->create == b->create && a->mod == b->mod && a->ver == b->ver &&
	       (!full || a->lease == b->lease);
}

/* A watch's events are the model's in its range from its start: a prefix of
 * whole revisions, or all of them while it is open. */
static void fz_check_watch(struct fz_op *o)
{
	static struct fz_ev want[FZ_MAXEV];
	int i, n = 0;

	if (o->over)
		return;
	for (i = 0; i < M.nhist; i++)
		if (M.hist[i].rev >= o->start && fz_in(o->sel, M.hist[i].key)) {
			if (n == FZ_MAXEV)
				return;
			want[n++] = M.hist[i];
		}
	qsort(want, (size_t)n, sizeof *want, fz_ev_cmp);
	qsort(o->ev, (size_t)o->nev, sizeof *o->ev, fz_ev_cmp);
	FZ_CHECK(o->nev <= n);
	if (!o->cancel_req && !o->finals)
		FZ_CHECK(o->nev == n); /* open, and the loop idle: it has them all */
	FZ_CHECK(o->nev == n || o->nev == 0 || want[o->nev].rev != want[o->nev - 1].rev); /* whole revisions */
	for (i = 0; i < o->nev; i++) {
		FZ_CHECK(o->ev[i].rev == want[i].rev && o->ev[i].key == want[i].key && o->ev[i].del == want[i].del);
		if (!want[i].del)
			FZ_CHECK(fz_key_eq(&o->ev[i].kv, &want[i].kv, 1));
		if (o->flags & KVD_WATCH_PREV_KV)
			FZ_CHECK(fz_key_eq(&o->ev[i].prev, &want[i].prev, 1));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64];
	struct kvd_config cfg;
	char err[KVD_ERRLEN];
	struct fz_op *o;
	size_t at = 0;
	int i, steps = 0;

	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-embed-XXXXXX");
		if (!mkdtemp(dir))
			abort();
	}
	if (fz_clean(dir))
		fz_fail("a subdirectory in the data dir", __LINE__);
	memset(&M, 0, sizeof M);
	kvd_config_init(&cfg);
	cfg.data_dir = dir;
	cfg.listen_client_urls = "";
	cfg.log_level = KVD_LOG_ERROR + 1;
	cfg.unsafe_no_fsync = 1;
	if (kvd_open(&cfg, &M.k, err, sizeof err)) {
		fprintf(stderr, "kvd_open: %s\n", err);
		abort();
	}
	M.base = M.rev = M.k->db.rev;
#define FZ_ARG() (at < size ? data[at++] : 0)
	while (at < size && steps++ < 200) {
		unsigned op = FZ_ARG(), a = FZ_ARG(), b = FZ_ARG();
		switch (op % 13) {
		case 0: /* put key, value, lease (0, 1, 2) */
			fz_put(a & 3, b, (a >> 2) % 4 % 3);
			break;
		case 1: /* delete */
			if (!(o = fz_new(OP_DEL)))
				break;
			o->key = a & 3;
			M.inside++;
			fz_started(o, kvd_delete(M.k, fz_keys[o->key], 2, fz_result, o));
			M.inside--;
			break;
		case 2: /* cas against the key's mod_revision as the model has it, or another */
			if (!(o = fz_new(OP_CAS)))
				break;
			o->key = a & 3;
			o->val = b;
			o->arg = a & 4 ? M.st[M.rev - M.base][o->key].mod : (a >> 3) % 8;
			{
				uint8_t v[2] = {'c', (uint8_t)b};
				M.inside++;
				fz_started(o, kvd_cas(M.k, fz_keys[o->key], 2, o->arg, v, 2, fz_result, o));
				M.inside--;
			}
			break;
		case 3: /* get, now or at an old revision */
			if (!(o = fz_new(OP_GET)))
				break;
			o->key = a & 3;
			o->arg = a & 4 ? M.rev - (int64_t)(b % (uint64_t)(M.rev - M.base + 1)) : 0;
			M.inside++;
			fz_started(o, kvd_get(M.k, fz_keys[o->key], 2, o->arg, fz_result, o));
			M.inside--;
			break;
		case 4: /* get_prefix "a", "b" or "", with a limit */
			if (!(o = fz_new(OP_PREFIX)))
				break;
			o->sel = 4 + a % 3;
			o->lease = b % 4; /* the limit */
			M.inside++;
			fz_started(o, kvd_get_prefix(M.k, o->sel == 4 ? "a" : "b", o->sel == 6 ? 0 : 1, 0, o->lease,
			                             fz_result, o));
			M.inside--;
			break;
		case 5: /* watch */
			if (M.nw == FZ_MAXW || !(o = fz_new(OP_WATCH)))
				break;
			o->sel = a % 7;
			o->flags = (a & 8 ? KVD_WATCH_PREV_KV : 0) | (o->sel >= 4 ? KVD_WATCH_PREFIX : 0);
			o->start = b & 1 ? M.k->db.rev - (b >> 1) % 4 : 0;
			if (o->start < 1)
				o->start = 1;
			o->cancel_in_cb = (a & 16) != 0;
			o->put_in_cb = (a & 32) != 0;
			o->key = b >> 4 & 3;
			o->ev = M.evs[M.nw];
			M.w[M.nw++] = (int)(o - M.ops);
			M.inside++;
			fz_started(o, kvd_watch(M.k, o->sel < 4 ? fz_keys[o->sel] : o->sel == 4 ? "a" : "b",
			                        o->sel == 6 ? 0 : o->sel < 4 ? 2 : 1, b & 1 ? o->start : 0, o->flags,
			                        fz_watch_cb, o, &o->s));
			M.inside--;
			if (!(b & 1))
				o->start = M.k->db.rev_durable + 1; /* after now: what is durable (a write in the open batch is seen) */
			break;
		case 6: /* cancel a watch now, or from inside the next callback */
			if (!M.nw)
				break;
			o = &M.ops[M.w[a % M.nw]];
			if (b & 1) {
				M.pending_cancel = a % M.nw + 1;
			} else if (!o->finals) {
				M.inside++;
				kvd_stream_cancel(o->s);
				M.inside--;
				o->cancel_req = 1;
			}
			break;
		case 7: /* the next callback puts */
			M.pending_put = 1;
			break;
		case 8: /* lease grant */
			if (!(o = fz_new(OP_GRANT)))
				break;
			o->lease = 1 + a % 2;
			M.inside++;
			fz_started(o, kvd_lease_grant(M.k, 3600, o->lease, fz_result, o));
			M.inside--;
			break;
		case 9: /* lease revoke */
			if (!(o = fz_new(OP_REVOKE)))
				break;
			o->lease = 1 + a % 2;
			M.inside++;
			fz_started(o, kvd_lease_revoke(M.k, o->lease, fz_result, o));
			M.inside--;
			break;
		case 10: /* an unknown method */
			if (!(o = fz_new(OP_NOPE)))
				break;
			M.inside++;
			fz_started(o, kvd_call(M.k, "/etcdserverpb.KV/Nope", NULL, 0, NULL, fz_reply, o, NULL));
			M.inside--;
			break;
		default: /* loop turns */
			fz_turns(1 + a % 4);
			break;
		}
	}
	for (i = 0; i < 200 && !fz_idle(); i++)
		fz_turns(1);
	FZ_CHECK(fz_idle());
	fz_turns(4); /* the watches catch up */
	for (i = 0; i < M.nw; i++)
		fz_check_watch(&M.ops[M.w[i]]);
	M.closing = 1;
	if (kvd_close(M.k))
		fz_fail("kvd_close", __LINE__);
	for (i = 0; i < M.nops; i++)
		FZ_CHECK(M.ops[i].finals == 1);
	return 0;
}
