/*
 * test/fuzz_json.c - libFuzzer target: the JSON reader and writer.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Whatever parses is written out, and what was written must parse again
 * and write out to the same bytes (the writer's output is canonical); the
 * writer's output is ASCII.  Everything is freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
	if (k->mem != base)
		abort();
	kvd_close(k);
	return 0;
}
