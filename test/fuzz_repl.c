/*
 * test/fuzz_repl.c - libFuzzer target: a hostile cluster under a replica.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The replica (section 36) follows what a member sends; here the member is
 * the input.  A kvd with --replicate-from gets, as its connection to the
 * cluster, a client connection (section 30's grpc_cl) that the harness
 * feeds: the server's SETTINGS, then, op by op, what a server may send on
 * the calls the replica made (its Watch, HashKV, the Range pages that
 * compare the keys, the compaction probe, a Snapshot, forwarded writes and
 * linearizable probes): response HEADERS, gRPC messages of any bytes (the
 * seeds hold real WatchResponse, HashKVResponse and RangeResponse
 * messages for libFuzzer to mutate), trailers with any status and text,
 * RST_STREAM, GOAWAY, raw bytes; the clock moves and the replica's timers
 * run; the group commit runs; in-process Puts and linearizable Gets are
 * started on the replica (forwarded, or held for a probe).
 *
 * The first byte picks the store the replica starts with: empty (it seeds
 * from a snapshot), three revisions of its own (it asks HashKV first), or
 * the same taken as verified (it follows at once), or that with
 * --replicate-user (it authenticates first: the token then goes with every
 * call).
 *
 * What must hold: no crash, no sanitizer report, no KVD_ALWAYS/KVD_NEVER
 * (the replay build has KVD_CHECKS), the store's revision never goes back,
 * every in-process call started gets exactly one last callback, and
 * kvd_close finds nothing leaked.
 */
#define KVD_NO_MAIN
#include "../kvd.c"
#include "lib/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fz_calls, fz_lasts;

static void fz_fail(const char *what, int line)
{
	fprintf(stderr, "fuzz_repl: %s (line %d)\n", what, line);
	abort();
}
#define FZ_CHECK(x) ((x) ? (void)0 : fz_fail(#x, __LINE__))

static void fz_done(void *arg, const struct kvd_result *r)
{
	(void)arg, (void)r;
	fz_lasts++;
}


static struct kvd *fz_open(const char *dir, const char *from, const char *user)
{
	struct kvd_config cfg;
	struct kvd *k;
	char err[KVD_ERRLEN];

	kvd_config_init(&cfg);
	cfg.data_dir = dir;
	cfg.listen_client_urls = "";
	cfg.log_level = KVD_LOG_ERROR + 1;
	cfg.unsafe_no_fsync = 1;
	cfg.replicate_from = from;
	cfg.replicate_user = user;
	if (kvd_open(&cfg, &k, err, sizeof err)) {
		fprintf(stderr, "kvd_open: %s\n", err);
		abort();
	}
	return k;
}

/* One frame from the server into c->in. */
static void fz_frame(struct kvd *k, struct conn *c, unsigned type, unsigned flags, uint32_t sid, const void *p,
                     size_t n)
{
	uint8_t h[9];

	h[0] = (uint8_t)(n >> 16);
	h[1] = (uint8_t)(n >> 8);
	h[2] = (uint8_t)n;
	h[3] = (uint8_t)type;
	h[4] = (uint8_t)flags;
	put_be32(h + 5, sid & 0x7fffffffu);
	if (buf_append(k, &c->in, h, sizeof h) || (n && buf_append(k, &c->in, p, n)))
		return;
}

/* The i-th call on cl whose HEADERS went and that has not ended (0 if none). */
static uint32_t fz_stream(struct grpc_cl *cl, unsigned i)
{
	struct grpc_cl_stream *s;
	unsigned n = 0;

	for (s = cl->st; s; s = s->next)
		if (s->id && !s->ended)
			n++;
	if (!n)
		return 0;
	i %= n;
	for (s = cl->st; s; s = s->next)
		if (s->id && !s->ended && !i--)
			return s->id;
	return 0;
}

#define FZ_HEADED 64
static uint32_t fz_headed[FZ_HEADED];

/* The response HEADERS once per stream: :status 200, application/grpc. */
static void fz_head(struct kvd *k, struct conn *c, uint32_t sid)
{
	static const uint8_t block[] = {0x88, 0x0f, 0x10, 16, 'a', 'p', 'p', 'l', 'i', 'c', 'a', 't', 'i', 'o', 'n', '/',
	                                'g', 'r', 'p', 'c'};
	unsigned i;

	for (i = 0; i < FZ_HEADED && fz_headed[i]; i++)
		if (fz_headed[i] == sid)
			return;
	if (i < FZ_HEADED)
		fz_headed[i] = sid;
	fz_frame(k, c, 1, 4, sid, block, sizeof block);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64];
	struct kvd *k;
	struct repl *rp;
	struct conn *c;
	struct grpc_cl *cl;
	size_t at = 0;
	int64_t rev;
	unsigned mode, steps = 0;

	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-repl-XXXXXX");
		if (!mkdtemp(dir))
			abort();
	}
	if (fz_clean(dir))
		fz_fail("a subdirectory in the data dir", __LINE__);
	memset(fz_headed, 0, sizeof fz_headed);
	fz_calls = fz_lasts = 0;
	mode = size ? data[at++] % 4 : 0;
	if (mode) { /* a store of its own first: three revisions */
		k = fz_open(dir, NULL, NULL);
		FZ_CHECK(!kvd_put(k, "a", 1, "1", 1, 0, fz_done, NULL) && !kvd_put(k, "b", 1, "2", 1, 0, fz_done, NULL) &&
		         !kvd_put(k, "a", 1, "3", 1, 0, fz_done, NULL));
		while (fz_lasts < 3)
			FZ_CHECK(kvd_poll(k, 10) >= 0);
		FZ_CHECK(kvd_close(k) == 0);
		fz_lasts = 0;
	}
	k = fz_open(dir, "http://127.0.0.1:9", mode == 3 ? "root:pw" : NULL);
	rp = k->repl;
	FZ_CHECK(rp && rp->state == REPL_WAIT);
	k->now = util_now_ms();
	/* the connection the replica would open: the input is its server */
	c = net_conn_new(k, -1, &net_plain);
	cl = kvd_calloc(k, sizeof *cl);
	FZ_CHECK(c && cl);
	c->uncounted = 1;
	snprintf(cl->authority, sizeof cl->authority, "127.0.0.1:9");
	FZ_CHECK(grpc_cl_attach(k, c, cl) == 0);
	rp->cl = cl;
	if (mode >= 2)
		rp->verified = 1;
	repl_watch(k, rp);
	fz_frame(k, c, 4, 0, 0, NULL, 0); /* the server's SETTINGS */
	rev = k->db.rev;
#define FZ_BYTE() (at < size ? data[at++] : 0)
	while (at < size && steps++ < 400 && !c->dead && !c->is_closing && rp->cl == cl) {
		unsigned op = FZ_BYTE(), sel = op >> 3;
		uint32_t sid;
		size_t n;

		net_input(k, c);
		if (c->proto && !c->is_closing)
			c->proto->flush(k, c);
		buf_consume(&c->out, BUF_LEN(&c->out)); /* the server reads all */
		if (c->dead || c->is_closing || rp->cl != cl)
			break;
		sid = fz_stream(cl, sel);
		switch (op & 7) {
		case 0: /* a message on a call: 2 bytes of length, then the bytes */
			n = FZ_BYTE();
			n |= (size_t)FZ_BYTE() << 8;
			n = KVD_MIN(n, size - at);
			if (!sid)
				break;
			{
				uint8_t *m = kvd_malloc(k, n + 5);
				if (!m)
					break;
				m[0] = 0;
				put_be32(m + 1, (uint32_t)n);
				memcpy(m + 5, data + at, n);
				fz_head(k, c, sid);
				fz_frame(k, c, 0, 0, sid, m, n + 5);
				kvd_free(k, m);
			}
			at += n;
			break;
		case 1: /* trailers: a status, a message */
			n = FZ_BYTE() % 24;
			if (sid) {
				uint8_t b[96];
				size_t bl = 0, ml = (size_t)FZ_BYTE() % 48;
				char st[4];
				int sl = snprintf(st, sizeof st, "%u", (unsigned)(n % 17));
				ml = KVD_MIN(ml, size - at);
				fz_head(k, c, sid);
				b[bl++] = 0;
				b[bl++] = 11;
				memcpy(b + bl, "grpc-status", 11);
				bl += 11;
				b[bl++] = (uint8_t)sl;
				memcpy(b + bl, st, (size_t)sl);
				bl += (size_t)sl;
				b[bl++] = 0;
				b[bl++] = 12;
				memcpy(b + bl, "grpc-message", 12);
				bl += 12;
				b[bl++] = (uint8_t)ml;
				memcpy(b + bl, data + at, ml);
				bl += ml;
				at += ml;
				fz_frame(k, c, 1, 5, sid, b, bl);
			}
			break;
		case 2: /* RST_STREAM */
			if (sid) {
				uint8_t b[4] = {0, 0, 0, (uint8_t)FZ_BYTE() % 14};
				fz_frame(k, c, 3, 0, sid, b, 4);
			}
			break;
		case 3: /* GOAWAY below or above the calls */
			{
				uint8_t b[8];
				put_be32(b, sel & 1 ? 0x7fffffffu : 0);
				put_be32(b + 4, 0);
				fz_frame(k, c, 7, 0, 0, b, 8);
			}
			break;
		case 4: /* time passes: the replica's and the connection's timers */
			k->now += (int64_t)(FZ_BYTE() + 1) * 100;
			repl_timers(k);
			net_timers(k, c);
			break;
		case 5: /* the group commit */
			loop_log_flush(k);
			call_local_flush(k);
			break;
		case 6: /* raw bytes as they come */
			n = FZ_BYTE();
			n = KVD_MIN(n, size - at);
			if (n && buf_append(k, &c->in, data + at, n))
				break;
			at += n;
			break;
		case 7: /* a client of the replica: a Put (forwarded) or a linearizable Get (probed) */
			if (sel & 1 ? !kvd_put(k, "k", 1, "v", 1, 0, fz_done, NULL) : !kvd_get(k, "k", 1, 0, fz_done, NULL))
				fz_calls++;
			break;
		}
		FZ_CHECK(k->db.rev >= rev); /* applied revisions are never taken back */
		rev = k->db.rev;
	}
	net_input(k, c);
	loop_log_flush(k);
	call_local_flush(k);
	if (getenv("FZ_REPL_DEBUG")) /* what an input reached */
		fprintf(stderr, "mode %u: revision %lld, state %d, verified %d, seeded %d, %llu revisions applied, "
		        "%llu forwarded, compacted %lld, %d calls\n", mode, (long long)k->db.rev, (int)rp->state,
		        (int)rp->verified, !rp->seeding, (unsigned long long)k->st.repl_revs,
		        (unsigned long long)k->st.repl_forwarded, (long long)k->db.compacted, fz_calls);
	net_conn_free(k, c); /* its calls end UNAVAILABLE: the replica lets the connection go */
	k->now += 60000; /* held calls time out */
	repl_timers(k);
	loop_log_flush(k);
	call_local_flush(k);
	FZ_CHECK(kvd_close(k) == 0); /* the calls still open end here; nothing may leak (KVD_CHECKS) */
	FZ_CHECK(fz_lasts == fz_calls); /* [§16.7] one last callback each */
	return 0;
}
