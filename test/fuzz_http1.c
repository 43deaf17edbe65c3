/*
 * test/fuzz_http1.c - libFuzzer target: HTTP/1.1 on the client port (the
 * request-head parser, bodies, the gateway's calls) and the gateway's JSON
 * mapping.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The first input byte picks the mode.  Bit 7 clear: the rest is what an
 * HTTP/1.1 client sends, after a head chosen by bits 0-1 (none; a chunked
 * /v3/watch; a /v3/kv/txn whose Content-Length is the rest; a chunked
 * /v3/lease/keepalive), fed in chunks of 1 << bits 2-4 bytes (7: all at
 * once) to an instance with a real store, so gateway calls reach real
 * handlers; the log is flushed and timers run between chunks, and bit 5
 * leaves kvd's output unread.  Bit 7 set: the rest is JSON for the request
 * message of gateway route (bits 0-6): the protobuf bytes json_pj_decode
 * makes from the value json_scan finds must pass etcd's decoder checks and
 * unpack, and the JSON written
 * from them must map to bytes that write the same JSON again (the mapping
 * is stable on its own output).  Everything must be freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"
#include "lib/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz_quiet(void *arg, int level, const char *line)
{
	(void)arg;
	(void)level;
	(void)line;
}

/* JSON -> protobuf -> JSON -> protobuf -> JSON: the last two JSONs agree.
 * The gateway's reading: json_scan finds one value, json_pj_decode makes
 * the request's bytes from it (protojson's rules). */
static void fz_mapping(struct kvd *k, const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
	struct kvd_buf pb1 = {0}, pb2 = {0}, j1 = {0}, j2 = {0};
	char why[JSON_PB_WHY];
	ProtobufCMessage *m;
	unsigned flags;
	size_t from, to;
	int oom;

	if (json_scan(p, n, 1, &from, &to, why) == 0 && to > from &&
	    json_pj_decode(k, &pb1, d, p + from, to - from, why) == 0 && !buf_reserve(k, &pb1, 1)) { /* never NULL */
		if (pb_check(d, BUF_DATA(&pb1), BUF_LEN(&pb1), PB_MAX_DEPTH, why, sizeof why, &flags) == 0 &&
		    !(flags & PB_F_STRIP)) {
			if (!(m = pb_unpack(k, d, BUF_DATA(&pb1), BUF_LEN(&pb1), &oom))) {
				if (!oom)
					abort(); /* the mapping made bytes protobuf-c refuses */
			} else {
				json_pb_write(k, &j1, m, 0);
				pb_free(k, m);
			}
		}
	}
	if (BUF_LEN(&j1) && !j1.err) {
		if (json_scan(BUF_DATA(&j1), BUF_LEN(&j1), 1, &from, &to, why) || from != 0 || to != BUF_LEN(&j1))
			abort(); /* the writer's JSON must read back, whole */
		if (json_pj_decode(k, &pb2, d, BUF_DATA(&j1), BUF_LEN(&j1), why) || buf_reserve(k, &pb2, 1))
			abort(); /* and map back */
		if ((m = pb_unpack(k, d, BUF_DATA(&pb2), BUF_LEN(&pb2), &oom))) {
			json_pb_write(k, &j2, m, 0);
			pb_free(k, m);
			if (!j2.err && (BUF_LEN(&j1) != BUF_LEN(&j2) || memcmp(BUF_DATA(&j1), BUF_DATA(&j2), BUF_LEN(&j1))))
				abort(); /* not stable on its own output */
		} else if (!oom) {
			abort();
		}
	}
	buf_free(k, &pb1);
	buf_free(k, &pb2);
	buf_free(k, &j1);
	buf_free(k, &j2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const heads[] = {
		"",
		"POST /v3/watch HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /v3/kv/txn HTTP/1.1\r\nContent-Length: ", /* + the rest's length */
		"POST /v3/lease/keepalive HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
	};
	static char dir[64];
	char path[96], head[160], err[KVD_ERRLEN];
	struct kvd *k;
	struct conn *c;
	size_t off = 0, step, n, base;
	unsigned mode;

	if (!size)
		return 0;
	mode = data[0];
	data++;
	size--;
	if (mode & 0x80) { /* the mapping alone */
		const char *rpc = gw_routes[(mode & 0x7f) % KVD_COUNT(gw_routes)].rpc;
		const struct grpc_method *m;
		const char *slash = strrchr(rpc, '/');
		int known;
		if (!(k = fz_kvd("/nonexistent")))
			return 0;
		base = k->mem;
		m = svc_route(rpc + 1, (size_t)(slash - rpc - 1), slash + 1, strlen(slash + 1), &known);
		if (m && m->req)
			fz_mapping(k, m->req, data, size);
		if (k->mem != base)
			abort();
		kvd_close(k);
		return 0;
	}
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "%s/kvd-fuzz-http1-XXXXXX", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
		if (!mkdtemp(dir))
			abort();
	}
	snprintf(path, sizeof path, "%s/kvd.log", dir);
	unlink(path);
	if (!(k = fz_kvd(dir)))
		return 0;
	k->cfg.max_request_bytes = 4096;
	if (mvcc_open(k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	kvd_set_log(k, fz_quiet, NULL);
	base = k->mem;
	if (!(c = net_conn_new(k, -1, &net_plain))) {
		kvd_close(k);
		return 0;
	}
	snprintf(head, sizeof head, "%s", heads[mode & 3]);
	if ((mode & 3) == 2)
		snprintf(head + strlen(head), sizeof head - strlen(head), "%zu\r\n\r\n", size);
	buf_append(k, &c->in, head, strlen(head));
	step = ((mode >> 2) & 7) == 7 ? size : (size_t)1 << ((mode >> 2) & 7);
	do {
		n = KVD_MIN(step, size - off);
		if (buf_append(k, &c->in, data + off, n))
			break;
		off += n;
		net_input(k, c);
		loop_log_flush(k);
		if (c->proto && !c->is_closing)
			c->proto->flush(k, c);
		if (!(mode & 0x20))
			buf_consume(&c->out, BUF_LEN(&c->out));
		k->now += 997;
		net_timers(k, c);
		lease_timers(k);
	} while (off < size && !c->is_closing && !c->dead);
	net_conn_free(k, c);
	(void)base; /* the store holds what the calls wrote: kvd_close checks the rest */
	kvd_close(k);
	return 0;
}
