/*
 * test/fuzz_pb.c - libFuzzer target: request messages of every gRPC method.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Byte 0 picks the method (every routed method, implemented or not, in
 * table order); the rest is a sequence of messages, each a 2-byte big-endian
 * length and its bytes.  Each message goes through the decoder (pb_check,
 * protobuf-c) and, for implemented methods, through the real handler on a
 * stream of a store in a fresh directory: unary calls take the first
 * message, streaming calls all of them, as an in-process call (no transport);
 * then the client half-closes; after each, the log is flushed (watch events,
 * held replies) and the call's producer runs, as the loop would.  Everything
 * must be freed; `make test` replays the corpus
 * under ASan with a 256 KiB stack, so a recursion a message can drive fails
 * the build.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct grpc_method *fz_method(unsigned i)
{
	size_t s, n = 0;

	for (s = 0; s < KVD_COUNT(svc_services); s++)
		n += svc_services[s].n;
	i %= (unsigned)n;
	for (s = 0; i >= svc_services[s].n; s++)
		i -= (unsigned)svc_services[s].n;
	return &svc_services[s].m[i];
}

static const struct call_carrier fz_carrier = {"in-process", NULL};

/* What the loop does after a message: the group commit (held replies, watch
 * events), then the call's producer while it has room, its output taken. */
static void fz_drain(struct kvd *k, struct call *c)
{
	int i;

	loop_log_flush(k);
	for (i = 0; i < 64 && c->produce && !c->finished; i++) {
		buf_consume(&c->out, BUF_LEN(&c->out));
		c->m->on_produce(k, c);
		loop_log_flush(k);
	}
	buf_consume(&c->out, BUF_LEN(&c->out));
}

static void fz_log(void *arg, int level, const char *line)
{
	(void)arg;
	(void)level;
	if (strstr(line, "still allocated"))
		abort(); /* a leak kvd's own accounting sees */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64];
	const struct grpc_method *m;
	struct kvd_config cfg;
	struct kvd *k;
	struct call call;
	char err[KVD_ERRLEN], path[128];
	const uint8_t *p, *end = data + size;
	ProtobufCMessage *msg;
	unsigned flags;
	size_t n;
	int oom;

	if (!size)
		return 0;
	m = fz_method(data[0]);
	/* the decoder alone, for every message */
	for (p = data + 1; m->req && end - p >= 2; p += n) {
		n = KVD_MIN(get_be16(p), (size_t)(end - p - 2));
		p += 2;
		kvd_config_init(&cfg);
		cfg.log_level = KVD_LOG_ERROR + 1;
		if (kvd_init(&cfg, &k, err, sizeof err) == 0 &&
		    pb_check(m->req, p, n, PB_MAX_DEPTH, err, sizeof err, &flags) == 0 &&
		    (msg = pb_unpack(k, m->req, p, n, &oom)))
			pb_free(k, msg);
		kvd_close(k);
	}
	if (!m->on_msg)
		return 0;
	/* the handler, on a real store */
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "%s/kvd-fuzz-pb-XXXXXX", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
		if (!mkdtemp(dir))
			abort();
	}
	snprintf(path, sizeof path, "%s/kvd.log", dir);
	unlink(path);
	kvd_config_init(&cfg);
	cfg.log_level = KVD_LOG_WARN;
	cfg.data_dir = dir;
	cfg.unsafe_no_fsync = 1;
	cfg.max_request_bytes = 4096;
	if (kvd_init(&cfg, &k, err, sizeof err) || mvcc_open(k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	kvd_set_log(k, fz_log, NULL);
	call_init(k, &call, m, &fz_carrier); /* an in-process call: no transport at all */
	for (p = data + 1; end - p >= 2 && !call.finished; p += n) {
		n = KVD_MIN(get_be16(p), (size_t)(end - p - 2));
		p += 2;
		call_message(k, &call, p, n);
		fz_drain(k, &call);
	}
	call_half_close(k, &call, 0);
	fz_drain(k, &call);
	call_fini(k, &call);
	kvd_close(k);
	return 0;
}
