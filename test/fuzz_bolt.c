/*
 * test/fuzz_bolt.c - libFuzzer target: importing hostile etcd snapshots.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The input (after byte 0; its bit 0 asks for the SHA-256 trailer check) is
 * a snapshot file.  The import must refuse it with a reason, or write a log
 * that replays to the same revision, compaction, keys and leases; then the
 * snapshot kvd makes of that store must import again to the same store and
 * HashKV.
 * Everything is freed.
 */
#define KVD_NO_MAIN
#include "../kvd.c"
#include "lib/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


/* Import p[0..n) into dir/kvd.log: 0 and the scratch instance's revision,
 * compaction, key and lease counts, or the import's error. */
static int fz_import(const char *dir, const uint8_t *p, size_t n, int skip, int64_t st[4])
{
	char path[160], why[200];
	struct kvd *k = fz_kvd(dir);
	int fd, e;

	if (!k)
		return KVD_ENOMEM;
	snprintf(path, sizeof path, "%s/kvd.log", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		abort();
	e = snap_import_mem(k, p, n, skip, fd, why, sizeof why);
	if (e && !why[0])
		abort(); /* a refusal always says why */
	st[0] = k->db.rev;
	st[1] = k->db.compacted;
	st[2] = (int64_t)k->db.nkeys;
	st[3] = (int64_t)k->lease.n;
	close(fd);
	kvd_close(k);
	return e;
}

static struct kvd *fz_open(const char *dir, int64_t st[4])
{
	char err[KVD_ERRLEN];
	struct kvd *k = fz_kvd(dir);

	if (!k)
		return NULL;
	if (mvcc_open(k, err, sizeof err) || k->db.rev != st[0] || k->db.compacted != st[1] ||
	    (int64_t)k->db.nkeys != st[2] || (int64_t)k->lease.n != st[3])
		abort(); /* an import that succeeded replays to the same store */
	return k;
}

/* The snapshot of k (the file, trailer included) into a malloc'd buffer. */
static int fz_snapshot(struct kvd *k, const char *dir, uint8_t **file, size_t *len)
{
	char path[160];
	struct stat st;
	int fd, e;

	snprintf(path, sizeof path, "%s/snap.db", dir);
	if ((fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600)) < 0)
		abort();
	e = snap_save_fd(k, fd);
	if (!e && (fstat(fd, &st) || !(*file = malloc((size_t)st.st_size + 1)) ||
	           pread(fd, *file, (size_t)st.st_size, 0) != st.st_size))
		abort();
	*len = e ? 0 : (size_t)st.st_size;
	close(fd);
	unlink(path);
	return e;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[64], dir2[80];
	int64_t st[4], st2[4];
	uint8_t *snap = NULL;
	size_t snaplen = 0;
	struct kvd *k;
	uint32_t h1 = 0, h2 = 0;

	if (!size)
		return 0;
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-bolt-XXXXXX");
		if (!mkdtemp(dir))
			abort();
		snprintf(dir2, sizeof dir2, "%s/again", dir);
		if (mkdir(dir2, 0700))
			abort();
	}
	if (fz_import(dir, data + 1, size - 1, !(data[0] & 1), st))
		return 0;
	if (!(k = fz_open(dir, st)))
		return 0;
	if (snap_hashkv(k, k->db.rev, &h1) || fz_snapshot(k, dir, &snap, &snaplen))
		abort();
	kvd_close(k);
	if (fz_import(dir2, snap, snaplen, 0, st2) || memcmp(st, st2, sizeof st))
		abort(); /* kvd's own snapshot of the store imports to the same store */
	if (!(k = fz_open(dir2, st2)) || snap_hashkv(k, k->db.rev, &h2) || h1 != h2)
		abort();
	kvd_close(k);
	free(snap);
	return 0;
}
