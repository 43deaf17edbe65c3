/*
 * test/fuzz_h2.c - libFuzzer target: bytes from a hostile HTTP/2 client.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The bytes reach a connection that has not yet said what it speaks (the
 * protocol is chosen from them, as the loop does).  The first input byte
 * picks the mode: bit 0 prepends a valid preface and SETTINGS (so frames
 * are reached quickly), bits 1-3 the chunk size the input is fed in (1, 2,
 * 4 ... 64 bytes, or all at once), bit 4 whether kvd's output is drained (a
 * reading peer) or left to pile up.  The clock moves between chunks so
 * timers fire too; the log is flushed before each output flush, as the
 * loop does (a write's reply is held until then).  Everything must be
 * freed at the end.
 *
 * Bits 5-7 equal to 5 (mode & 0xe0 == 0xa0) turn the roles round: the
 * bytes come from a hostile server, to a connection kvd opened as a
 * client (section 30) with three calls started (Range, half-closed; a
 * Watch; a Snapshot); bit 0 then prepends the server's SETTINGS.  Each
 * call must hear exactly one last callback [§30.4], and everything must be
 * freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A call of the client role: its messages and last callbacks. */
struct fz_call {
	int msgs, lasts;
};

static int fz_reply(void *arg, const struct kvd_reply *r)
{
	struct fz_call *f = arg;

	if (r->last)
		f->lasts++;
	else
		f->msgs++;
	return 0;
}

/* The client role: data is what a hostile server sends. */
static void fz_client(struct kvd *k, struct conn *c, const uint8_t *data, size_t size, unsigned mode)
{
	static const uint8_t settings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
	static const char *const paths[3] = {"/etcdserverpb.KV/Range", "/etcdserverpb.Watch/Watch",
	                                     "/etcdserverpb.Maintenance/Snapshot"};
	struct fz_call calls[3];
	struct grpc_cl_stream *s;
	struct grpc_cl *cl = kvd_calloc(k, sizeof *cl);
	size_t off = 0, step, n;
	int i;

	memset(calls, 0, sizeof calls);
	c->uncounted = 1;
	if (!cl || grpc_cl_attach(k, c, cl)) {
		kvd_free(k, cl);
		net_conn_free(k, c);
		return;
	}
	for (i = 0; i < 3; i++) {
		if (grpc_cl_call(k, cl, paths[i], "\x0a\x01a", 3, fz_reply, &calls[i], &s))
			calls[i].lasts = 1; /* never started: nothing to hear */
		else if (!i)
			grpc_cl_half_close(k, s);
	}
	if (mode & 1) {
		buf_append(k, &c->in, settings, sizeof settings);
		net_input(k, c);
		c->proto->flush(k, c);
	}
	step = ((mode >> 1) & 7) == 7 ? size : (size_t)1 << ((mode >> 1) & 7);
	while (off < size && !c->is_closing && !c->dead) {
		n = KVD_MIN(step, size - off);
		if (buf_append(k, &c->in, data + off, n))
			break;
		off += n;
		net_input(k, c);
		if (!c->is_closing)
			c->proto->flush(k, c);
		if (mode & 0x10)
			buf_consume(&c->out, BUF_LEN(&c->out));
		k->now += 997;
		net_timers(k, c);
	}
	grpc_cl_close(k, cl);
	if (!c->is_closing)
		c->proto->flush(k, c);
	net_conn_free(k, c); /* the calls still open end UNAVAILABLE, cl goes */
	for (i = 0; i < 3; i++)
		if (calls[i].lasts != 1) /* [§30.4] one last callback each */
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
	struct kvd_config cfg;
	struct kvd *k;
	struct conn *c;
	char err[KVD_ERRLEN];
	size_t off = 0, step, n, base;
	int64_t rev0;
	unsigned mode;

	if (!size)
		return 0;
	mode = data[0];
	data++;
	size--;
	kvd_config_init(&cfg);
	cfg.log_level = KVD_LOG_ERROR + 1; /* quiet */
	if (kvd_init(&cfg, &k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	base = k->mem;
	rev0 = k->db.rev;
	c = net_conn_new(k, -1, &net_plain); /* the first bytes choose the protocol */
	if (!c) {
		kvd_close(k);
		return 0;
	}
	if ((mode & 0xe0) == 0xa0) {
		fz_client(k, c, data, size, mode);
		if (k->mem != base)
			abort();
		kvd_close(k);
		return 0;
	}
	if (mode & 1) {
		buf_append(k, &c->in, preface, sizeof preface - 1);
		net_input(k, c);
	}
	step = ((mode >> 1) & 7) == 7 ? size : (size_t)1 << ((mode >> 1) & 7);
	while (off < size && !c->is_closing && !c->dead) {
		n = KVD_MIN(step, size - off);
		if (buf_append(k, &c->in, data + off, n))
			break;
		off += n;
		net_input(k, c);
		loop_log_flush(k); /* as the loop: no reply leaves before its write is durable */
		if (c->proto)
			c->proto->flush(k, c);
		if (mode & 0x10)
			buf_consume(&c->out, BUF_LEN(&c->out));
		k->now += 997;
		net_timers(k, c);
		if (c->proto && !c->is_closing)
			c->proto->flush(k, c);
	}
	net_conn_free(k, c);
	/* a leak kvd's own accounting sees -- unless a call reached the store:
	 * its keys and leases, the held-reply list and the watch table stay
	 * for the next (kvd_close and LeakSanitizer check those) */
	if (k->mem != base && k->db.rev == rev0 && !k->lease.n && !k->heldcap && !k->watch.tab)
		abort();
	kvd_close(k);
	return 0;
}
