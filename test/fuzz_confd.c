/*
 * test/fuzz_confd.c - libFuzzer target: confd datagrams, in both modes.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Byte 0: bit 0 wraps the rest as the msg of an envelope signed with the
 * right key and a current salt (so the fuzzer reaches the request parser
 * and every query); bit 1 answers in Ganeti mode from a configuration
 * (test/corpus/confd-config.json, made by test/lib/ganeticonf.py) stored in the
 * keyspace; bit 2 stores a few keys for the keyspace mode.  A reply must be
 * a signed "plj0" datagram under the cap.  Everything is freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_KEY "5f2b7c0e9a1d4e8b3c6f0a2d5e8b1c4f7a0d3e6b\n"
#define FZ_NOW 1700000000

static char *fz_config(size_t *n)
{
	static char *cfg;
	static size_t len;
	FILE *f;

	if (!cfg) {
		f = fopen("test/corpus/confd-config.json", "rb");
		if (!f)
			f = fopen("../test/corpus/confd-config.json", "rb");
		if (!f)
			abort();
		fseek(f, 0, SEEK_END);
		len = (size_t)ftell(f);
		fseek(f, 0, SEEK_SET);
		cfg = malloc(len + 1);
		if (!cfg || fread(cfg, 1, len, f) != len)
			abort();
		fclose(f);
	}
	*n = len;
	return cfg;
}

static void fz_put(struct kvd *k, const char *key, const void *v, size_t n)
{
	struct mvcc_txn t;

	if (!mvcc_txn_begin(k, &t)) {
		mvcc_put(k, &t, (const uint8_t *)key, strlen(key), v, n, 0);
		mvcc_txn_end(k, &t);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64];
	struct kvd_config cfg;
	struct kvd *k;
	struct kvd_buf dg = {0};
	char err[KVD_ERRLEN], path[128];
	size_t n;
	FILE *f;

	if (!size)
		return 0;
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-confd-XXXXXX");
		if (!mkdtemp(dir))
			abort();
		snprintf(path, sizeof path, "%s/hmac.key", dir);
		f = fopen(path, "w");
		fputs(FZ_KEY, f);
		fclose(f);
		chmod(path, 0600);
	}
	snprintf(path, sizeof path, "%s/kvd.log", dir);
	unlink(path);
	kvd_config_init(&cfg);
	cfg.log_level = KVD_LOG_ERROR + 1;
	cfg.data_dir = dir;
	cfg.unsafe_no_fsync = 1;
	snprintf(path, sizeof path, "%s/hmac.key", dir);
	cfg.confd_hmac_key_file = path;
	cfg.confd_listen = "127.0.0.1:0";
	cfg.confd_ganeti_config_key = data[0] & 2 ? "g" : NULL;
	if (kvd_init(&cfg, &k, err, sizeof err) || mvcc_open(k, err, sizeof err) || confd_open(k, err, sizeof err))
		abort();
	if (data[0] & 2) {
		char *c = fz_config(&n);
		fz_put(k, "g", c, n);
	}
	if (data[0] & 4) {
		fz_put(k, "a/x", "1", 1);
		fz_put(k, "a/y", "\xff\x01", 2);
	}
	if (data[0] & 1) { /* a valid envelope around the fuzz bytes */
		uint8_t mac[20];
		char hx[41];
		int i;
		confd_hmac(k->confd, "1700000000", 10, data + 1, size - 1, mac);
		for (i = 0; i < 20; i++)
			sprintf(hx + 2 * i, "%02x", mac[i]);
		json_put_raw(k, &dg, "plj0{\"msg\":");
		json_put_str(k, &dg, data + 1, size - 1);
		json_put_raw(k, &dg, ",\"salt\":\"1700000000\",\"hmac\":\"");
		json_put_raw(k, &dg, hx);
		json_put_raw(k, &dg, "\"}");
		if (dg.err)
			abort();
	} else if (buf_append(k, &dg, data + 1, size - 1)) {
		abort();
	}
	if (confd_handle(k, dg.p, dg.len, FZ_NOW) == 0) {
		if (k->confd->out.len > KVD_CONFD_MAX_REPLY || memcmp(k->confd->out.p, "plj0{\"hmac\":\"", 13))
			abort();
	}
	buf_free(k, &dg);
	kvd_close(k);
	return 0;
}
