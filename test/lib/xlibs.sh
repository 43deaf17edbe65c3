#!/bin/sh
# test/lib/xlibs.sh NAME CC [CFLAGS [small]] - mbedtls and protobuf-c, built as
# static libraries with compiler CC from Debian's own source packages, for a
# target Debian has no -dev packages for (mips big-endian) or another libc
# (musl).  "small": mbedtls configured (with its own scripts/config.py) down
# to what kvd uses, as firmware trees build it: a TLS 1.2 server with ECDHE
# and AES-GCM or ChaCha20-Poly1305, X.509 and CRLs, RSA/ECDSA for JWTs and
# --auto-tls, P-256/384/521 and X25519; no DTLS, client, PSK, DHE, CBC, DES,
# Camellia, ARIA, PSA, renegotiation, tickets.
# Result: /var/cache/kvd-test/NAME/{include,lib}; done once, then reused.
# Needs deb-src (added here), dpkg-dev; nothing lands in the source tree.
set -eu
name=$1 cc=$2 cflags=${3:--Os} profile=${4:-debian}
top=/var/cache/kvd-test
out=$top/$name
[ -f "$out/.done" ] && grep -qx "$cc $cflags $profile" "$out/.done" && exit 0
SMALL="MBEDTLS_DES_C MBEDTLS_CAMELLIA_C MBEDTLS_ARIA_C MBEDTLS_ARC4_C MBEDTLS_BLOWFISH_C MBEDTLS_XTEA_C
MBEDTLS_RIPEMD160_C MBEDTLS_MD5_C MBEDTLS_CCM_C MBEDTLS_CMAC_C MBEDTLS_NIST_KW_C MBEDTLS_PSA_CRYPTO_C
MBEDTLS_PSA_CRYPTO_STORAGE_C MBEDTLS_PSA_ITS_FILE_C MBEDTLS_DHM_C MBEDTLS_ECJPAKE_C MBEDTLS_GENPRIME
MBEDTLS_ECP_DP_SECP192R1_ENABLED MBEDTLS_ECP_DP_SECP224R1_ENABLED MBEDTLS_ECP_DP_SECP192K1_ENABLED
MBEDTLS_ECP_DP_SECP224K1_ENABLED MBEDTLS_ECP_DP_SECP256K1_ENABLED MBEDTLS_ECP_DP_BP256R1_ENABLED
MBEDTLS_ECP_DP_BP384R1_ENABLED MBEDTLS_ECP_DP_BP512R1_ENABLED MBEDTLS_ECP_DP_CURVE448_ENABLED
MBEDTLS_KEY_EXCHANGE_PSK_ENABLED MBEDTLS_KEY_EXCHANGE_DHE_PSK_ENABLED MBEDTLS_KEY_EXCHANGE_ECDHE_PSK_ENABLED
MBEDTLS_KEY_EXCHANGE_RSA_PSK_ENABLED MBEDTLS_KEY_EXCHANGE_RSA_ENABLED MBEDTLS_KEY_EXCHANGE_DHE_RSA_ENABLED
MBEDTLS_KEY_EXCHANGE_ECDH_ECDSA_ENABLED MBEDTLS_KEY_EXCHANGE_ECDH_RSA_ENABLED MBEDTLS_KEY_EXCHANGE_ECJPAKE_ENABLED
MBEDTLS_SSL_PROTO_DTLS MBEDTLS_SSL_DTLS_ANTI_REPLAY MBEDTLS_SSL_DTLS_HELLO_VERIFY MBEDTLS_SSL_DTLS_CLIENT_PORT_REUSE
MBEDTLS_SSL_DTLS_BADMAC_LIMIT MBEDTLS_SSL_DTLS_CONNECTION_ID MBEDTLS_SSL_DTLS_SRTP MBEDTLS_SSL_COOKIE_C
MBEDTLS_SSL_CLI_C MBEDTLS_SSL_RENEGOTIATION MBEDTLS_SSL_SESSION_TICKETS MBEDTLS_SSL_TICKET_C MBEDTLS_SSL_CACHE_C
MBEDTLS_SSL_TRUNCATED_HMAC MBEDTLS_SSL_ENCRYPT_THEN_MAC MBEDTLS_SSL_CONTEXT_SERIALIZATION MBEDTLS_SSL_EXPORT_KEYS
MBEDTLS_SSL_CBC_RECORD_SPLITTING MBEDTLS_SSL_PROTO_TLS1 MBEDTLS_SSL_PROTO_TLS1_1 MBEDTLS_SSL_FALLBACK_SCSV
MBEDTLS_X509_CSR_PARSE_C MBEDTLS_X509_CSR_WRITE_C MBEDTLS_PKCS12_C MBEDTLS_PKCS5_C MBEDTLS_DEBUG_C
MBEDTLS_VERSION_FEATURES MBEDTLS_SELF_TEST MBEDTLS_TIMING_C MBEDTLS_NET_C MBEDTLS_PADLOCK_C
MBEDTLS_CIPHER_MODE_CBC MBEDTLS_CIPHER_MODE_CFB MBEDTLS_CIPHER_MODE_CTR MBEDTLS_CIPHER_MODE_OFB
MBEDTLS_CIPHER_MODE_XTS MBEDTLS_CIPHER_PADDING_PKCS7 MBEDTLS_CIPHER_PADDING_ONE_AND_ZEROS
MBEDTLS_CIPHER_PADDING_ZEROS_AND_LEN MBEDTLS_CIPHER_PADDING_ZEROS MBEDTLS_PK_PARSE_EC_EXTENDED"
src=$top/src
if ! ls -d $src/mbedtls-*/library >/dev/null 2>&1 || ! ls -d $src/protobuf-c-*/protobuf-c >/dev/null 2>&1; then
	if ! apt-cache showsrc mbedtls >/dev/null 2>&1 || [ -z "$(apt-cache showsrc mbedtls 2>/dev/null)" ]; then
		printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
			> /etc/apt/sources.list.d/kvd-src.sources
		apt-get update -qq >/dev/null 2>&1 || true
	fi
	command -v dpkg-source >/dev/null || apt-get install -y -qq --no-install-recommends dpkg-dev >/dev/null
	mkdir -p $src && (cd $src && apt-get source -qq mbedtls protobuf-c >/dev/null 2>&1)
fi
ar=$(echo "$cc" | sed -E 's/(gcc|cc)$/ar/')
command -v "$ar" >/dev/null || ar=ar
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
cp -r $src/mbedtls-*/ "$b/mbedtls"
if [ "$profile" = small ]; then
	for o in $SMALL; do python3 "$b/mbedtls/scripts/config.py" -f "$b/mbedtls/include/mbedtls/config.h" unset $o; done
	python3 "$b/mbedtls/scripts/config.py" -f "$b/mbedtls/include/mbedtls/config.h" set MBEDTLS_AES_FEWER_TABLES
fi
echo "xlibs: mbedtls for $name ($cc $cflags, $profile configuration)"
make -s -C "$b/mbedtls/library" -j2 CC="$cc" AR="$ar" CFLAGS="$cflags -I../include" static >/dev/null
mkdir -p "$out/lib" "$out/include/protobuf-c"
cp "$b"/mbedtls/library/lib*.a "$out/lib/"
cp -r "$b/mbedtls/include/mbedtls" "$out/include/"
[ -d "$b/mbedtls/include/psa" ] && cp -r "$b/mbedtls/include/psa" "$out/include/"
echo "xlibs: protobuf-c for $name"
p=$(ls -d $src/protobuf-c-*/protobuf-c)
$cc $cflags -I"$p/.." -c "$p/protobuf-c.c" -o "$b/protobuf-c.o"
rm -f "$out/lib/libprotobuf-c.a"
"$ar" rcs "$out/lib/libprotobuf-c.a" "$b/protobuf-c.o"
cp "$p/protobuf-c.h" "$out/include/protobuf-c/"
echo "$cc $cflags $profile" > "$out/.done"
