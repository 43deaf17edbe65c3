/*
 * test/fuzz_json.c - libFuzzer target: the JSON reader and writer.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Whatever parses is written out, and what was written must parse again
 * and write out to the same bytes (the writer's output is canonical); the
 * writer's output is ASCII.  The gateway's readers (json_scan, then
 * json_pj_decode into a request): a value found while more may come is the
 * one found at the end, a fault found then is the same fault, and every
 * error text is UTF-8 (else the gateway could not write it).  Everything
 * is freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_utf8(const char *s)
{
	const uint8_t *p = (const uint8_t *)s, *end = p + strlen(s);
	size_t l;

	for (; p < end; p += l)
		if (!(l = utf8_len(p, end)))
			abort();
}

static void fuzz_gateway(struct kvd *k, const uint8_t *data, size_t size)
{
	static const ProtobufCMessageDescriptor *const reqs[] = {
	    &etcdserverpb__txn_request__descriptor, &etcdserverpb__watch_request__descriptor,
	    &etcdserverpb__range_request__descriptor, &etcdserverpb__lease_grant_request__descriptor};
	char why[JSON_PB_WHY], why2[JSON_PB_WHY];
	size_t f1, t1, f2, t2;
	struct kvd_buf pb = {0};
	int r1 = json_scan(data, size, 1, &f1, &t1, why), r2 = json_scan(data, size, 0, &f2, &t2, why2);

	if (r1 == KVD_EAGAIN || (r2 == 0 && (r1 || f1 != f2 || t1 != t2)) ||
	    (r2 == KVD_EPROTO && (r1 != r2 || strcmp(why, why2))))
		abort();
	if (r1) {
		fuzz_utf8(why);
		return;
	}
	if (t1 == f1)
		return;
	if (json_pj_decode(k, &pb, reqs[size % KVD_COUNT(reqs)], data + f1, t1 - f1, why) == KVD_EPROTO)
		fuzz_utf8(why);
	buf_free(k, &pb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvd_config cfg;
	struct kvd *k;
	struct json_doc a, b;
	struct kvd_buf w1 = {0}, w2 = {0};
	char err[KVD_ERRLEN];
	const char *why;
	size_t i, base;

	kvd_config_init(&cfg);
	if (kvd_init(&cfg, &k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	base = k->mem;
	if (!json_parse(k, &a, data, size, &why)) {
		json_write(k, &w1, a.root);
		if (w1.err || json_parse(k, &b, w1.p, w1.len, &why))
			abort(); /* our own output must read back */
		json_write(k, &w2, b.root);
		if (w2.err || w1.len != w2.len || memcmp(w1.p, w2.p, w1.len))
			abort();
		for (i = 0; i < w1.len; i++)
			if (w1.p[i] >= 0x80 || w1.p[i] < 0x20)
				abort();
		json_free(&b);
		json_free(&a);
	}
	buf_free(k, &w1);
	buf_free(k, &w2);
	fuzz_gateway(k, data, size);
	if (k->mem != base)
		abort();
	kvd_close(k);
	return 0;
}
