/*
 * test/fuzz_hpack.c - libFuzzer target: the HPACK decoder and Huffman code.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Byte 0 sets the table size (via a size update), byte 1 where the rest is
 * split into two header blocks decoded on one table, so dynamic-table state
 * carries across blocks.  The whole input is also Huffman-decoded, and a
 * decoded string must have the length the validate-only pass reports.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct hp_field f[KVD_MAX_HEADER_FIELDS];
	static uint8_t arena[KVD_MAX_HEADER_LIST + HP_TABLE_SIZE + 64], out[1 << 17];
	struct kvd_config cfg;
	struct kvd *k;
	struct hp_table t;
	struct hp_out o;
	char err[KVD_ERRLEN];
	size_t split, i, base;
	long a, b;
	int r;

	if (size < 2)
		return 0;
	kvd_config_init(&cfg);
	if (kvd_init(&cfg, &k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	base = k->mem;
	hp_table_init(&t);
	hp_resize(&t, (size_t)data[0] * 16 > HP_TABLE_SIZE ? HP_TABLE_SIZE : (size_t)data[0] * 16);
	split = size > 2 ? 2 + data[1] % (size - 2) : 2;
	for (i = 0; i < 2; i++) {
		const uint8_t *p = i ? data + split : data + 2;
		size_t n = i ? size - split : split - 2;
		hp_out_init(&o, f, KVD_MAX_HEADER_FIELDS, arena, sizeof arena);
		r = hp_decode(k, &t, p, n, &o);
		if (r == 0 && (o.nf > o.maxf || o.alen > o.acap || t.size > t.max))
			abort();
		if (r)
			break;
	}
	hp_table_free(k, &t);
	a = hp_huff_decode(data, size, NULL, 0);
	b = hp_huff_decode(data, size, out, sizeof out);
	if (a != b && !(b == HP_ESPACE))
		abort();
	if (k->mem != base)
		abort(); /* a leak kvd's own accounting sees */
	kvd_close(k);
	return 0;
}
