/*
 * test/fuzz_log.c - libFuzzer target: log replay on hostile files.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The input becomes <dir>/kvd.log (byte 0: bit 0 prepends a valid header
 * record, so the fuzzer reaches records quickly).  Replay must either refuse
 * with an error or produce a sane index (and leases whose key sets are
 * exactly their live keys); then a write must append cleanly,
 * and a second replay must agree; then a rewrite of that log must finish
 * and replay to the same revision, keys, compaction and leases.
 * Everything is freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"
#include "lib/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct kvd *fz_open(const char *dir, int *rc)
{
	char err[KVD_ERRLEN];
	struct kvd *k = fz_kvd(dir);

	if (k)
		*rc = mvcc_open(k, err, sizeof err);
	return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64];
	static uint32_t crc[8][256]; /* CRC-32C's tables, for the header written below */
	char path[128];
	uint8_t hdr[MVCC_HEADER_REC];
	struct kvd *k;
	struct mvcc_it it = {0, 0};
	struct mvcc_key *r, *prev = NULL;
	struct mvcc_txn t;
	size_t n = 0, at2;
	struct lease *l2;
	int64_t rev, comp;
	size_t nl;
	int fd, rc, wrote;

	if (!size)
		return 0;
	if (!dir[0]) {
		mvcc_crc_init(crc);
		snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-log-XXXXXX");
		if (!mkdtemp(dir))
			abort();
	}
	snprintf(path, sizeof path, "%s/kvd.log", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		abort();
	if (data[0] & 1) {
		mvcc_header_encode(crc, hdr);
		if (write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr)
			abort();
	}
	if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
		abort();
	close(fd);
	k = fz_open(dir, &rc);
	if (!k)
		return 0;
	if (rc == 0) {
		while ((r = mvcc_at(&k->db, it))) { /* sorted, counted, revisions sane */
			if (prev && mvcc_cmp(prev->key, prev->klen, r->key, r->klen) >= 0)
				abort();
			if (r->mod > k->db.rev || mvcc_k_create(&k->db, r) > r->mod || (mvcc_k_create(&k->db, r) != 0) != !!(r->flags & MVCC_LIVE))
				abort();
			prev = r;
			n++;
			mvcc_next(&k->db, &it);
		}
		if (n != k->db.nkeys)
			abort();
		for (it.li = 0, it.ki = 0, n = 0; (r = mvcc_at(&k->db, it)); mvcc_next(&k->db, &it)) {
			int64_t id = mvcc_k_lease(&k->db, r);
			struct lease *l = id ? lease_find(k, id) : NULL;
			size_t at;
			if (!id)
				continue;
			if (!l || !l->keys) /* replay refuses a put naming a missing lease */
				abort();
			for (at = lease_kslot(l, r); l->keys[at] != r; at = (at + 1) & l->kmask)
				if (!l->keys[at])
					abort();
			n++;
		}
		for (at2 = 0; k->lease.tab && at2 <= k->lease.mask; at2++)
			for (l2 = k->lease.tab[at2]; l2; l2 = l2->hnext)
				n -= l2->nkeys;
		if (n)
			abort(); /* every attached key is a live key of that lease */
		rev = k->db.rev;
		wrote = 0; /* none at the last revision (2^63-1), or a "fuzz" key at the last version */
		if (!mvcc_txn_begin(k, &t)) {
			wrote = !mvcc_put(k, &t, (const uint8_t *)"fuzz", 4, (const uint8_t *)"v", 1, 0);
			mvcc_txn_end(k, &t);
		} else if (rev < INT64_MAX) {
			abort(); /* a store with revisions left takes a txn */
		}
		rev += wrote;
		if (mvcc_flush(k) == 0) {
			kvd_close(k);
			k = fz_open(dir, &rc);
			if (!k || rc != 0 || k->db.rev != rev)
				abort(); /* what we appended must replay */
			/* a log that replays rewrites, and the rewrite replays the same */
			n = k->db.nkeys;
			k->life.want = 1;
			for (rc = 0; rc < 100000 && (k->life.want || k->life.rw); rc++)
				life_step(k);
			if (k->life.rewrites != 1 || k->db.nkeys != n || k->db.rev != rev)
				abort();
			comp = k->db.compacted;
			nl = k->lease.n;
			kvd_close(k);
			k = fz_open(dir, &rc);
			if (!k || rc != 0 || k->db.rev != rev || k->db.nkeys != n || k->db.compacted != comp ||
			    k->lease.n != nl)
				abort();
		}
	}
	kvd_close(k);
	unlink(path);
	return 0;
}
