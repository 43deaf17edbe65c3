/*
 * test/fuzz_auth.c - libFuzzer target: what auth parses from a client, and
 * what it reads back from its own store.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Byte 0 chooses: 0, the rest is a token presented to the JWT verifier
 * (base64url, the signature, then the claims) as it stands; 1, the rest is
 * "header JSON \0 claims JSON", which the target signs (HS256) before the
 * verifier sees it, so the claims parser is reached -- a token it accepts
 * must have a username claim (a string, "" too, as etcd) and a revision; 2, the rest is a stored password hash
 * for auth_bcrypt_parse.  Nothing may leak.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t secret[] = "fuzz-secret";
	struct kvd_config cfg;
	struct kvd *k;
	struct auth_jwt *j;
	struct kvd_buf b = {0};
	char err[KVD_ERRLEN], *tok;
	uint8_t sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE], salt[16];
	const uint8_t *z;
	size_t base, n = 0;
	uint64_t rev = 0;
	unsigned cost;

	if (!size)
		return 0;
	kvd_config_init(&cfg);
	if (kvd_init(&cfg, &k, err, sizeof err)) {
		kvd_close(k);
		return 0;
	}
	base = k->mem;
	if (data[0] == 2) {
		if (!auth_bcrypt_parse(data + 1, size - 1, &cost, salt) && (cost < 4 || cost > 31))
			abort();
		goto out;
	}
	if (!(j = kvd_calloc(k, sizeof *j)) || !(j->secret = kvd_malloc(k, sizeof secret - 1)))
		abort();
	mbedtls_pk_init(&j->key);
	memcpy(j->secret, secret, sizeof secret - 1);
	j->nsecret = sizeof secret - 1;
	j->priv = 1;
	snprintf(j->alg, sizeof j->alg, "HS256");
	j->family = 'H';
	j->md = MBEDTLS_MD_SHA256;
	j->ttl_ms = 300000;
	k->auth.jwt = j;
	if (data[0] == 1 && (z = memchr(data + 1, 0, size - 1))) { /* sign what the fuzzer wrote */
		auth_b64url_put(k, &b, data + 1, (size_t)(z - data - 1));
		buf_append(k, &b, ".", 1);
		auth_b64url_put(k, &b, z + 1, size - (size_t)(z + 1 - data));
		if (b.err || auth_jwt_sig(k, j, b.p, b.len, sig, &n, 0))
			abort();
		buf_append(k, &b, ".", 1);
		auth_b64url_put(k, &b, sig, n);
	} else {
		buf_append(k, &b, data + 1, size - 1);
	}
	buf_append(k, &b, "", 1); /* metadata values are NUL-terminated */
	if (b.err)
		abort();
	tok = (char *)b.p;
	/* taken: its claims held a username (a string; "" is one, as etcd takes
	 * it: a user nobody has) and a revision */
	if (strlen(tok) == b.len - 1 && !auth_jwt_check(k, tok, &rev) &&
	    (!rev || k->auth.jwt->nlen >= sizeof k->auth.jwt->name))
		abort();
	buf_free(k, &b);
out:
	auth_jwt_free(k);
	if (k->mem != base)
		abort();
	kvd_close(k);
	return 0;
}
