#!/bin/sh
# test/lib/xlibs.sh NAME CC [CFLAGS [PROFILE [MBEDTLS]]] - mbedtls and
# protobuf-c, built as static libraries with compiler CC from Debian's own
# source packages, for a target Debian has no -dev packages for (mips
# big-endian), another libc (musl), or another mbedtls.  MBEDTLS: 2.28
# (Debian 12's, the default) or 3.6 (Debian 13's 3.6.6, as OpenWrt 24.10
# ships; its three source files pinned by SHA-256 below).  PROFILE "small":
# mbedtls configured (with its own scripts/config.py) down to what kvd uses,
# as firmware trees build it: a TLS 1.2 server (and with 3.6 a TLS 1.3 one)
# with ECDHE and AES-GCM or ChaCha20-Poly1305, X.509 and CRLs, RSA/ECDSA for
# JWTs and --auto-tls, P-256/384/521 and X25519; no DTLS, client, PSK, DHE,
# CBC, DES, Camellia, ARIA, renegotiation, tickets, SHA-1 (kvd has its own;
# mbedtls' default profile refuses certificates signed with it, as etcd 3.7
# does, so TLS had no use for it), SHA-224 (nothing kvd or TLS 1.2/1.3 takes
# uses it), SNI (kvd serves one certificate whatever name is asked), the
# curves' precomputed tables (3.6 keeps the PSA core TLS 1.3 runs on).  Every profile has MBEDTLS_PLATFORM_MEMORY, so kvd's
# allocator serves mbedtls too.
# Result: $KVD_CACHE/NAME/{include,lib} (/var/cache/kvd-test/...); done once, then reused.
# Sources, first found: MBEDTLS_SRC, PROTOBUF_C_SRC, MUSL_SRC (unpacked
# source trees you already have: a firmware tree's dl/ or build dir); else
# $KVD_CACHE/src; else Debian's source packages fetched from its pool
# (DEBIAN_POOL, deb.debian.org by default) into $KVD_CACHE/src, each file
# checked against the SHA-256 pinned here, unpacked with tar and Debian's
# patches applied with patch(1).  The host is left alone: no apt source is
# added and nothing installed.  Nothing lands in the source tree.
set -eu
# xlibs.sh --sources: only fetch the source packages (musl's too, which
# test/footprint.sh builds for the cross compilers) into $KVD_CACHE/src
name=$1 cc=${2:-} cflags=${3:--Os} profile=${4:-debian} ver=${5:-2.28}
top=${KVD_CACHE:-/var/cache/kvd-test}
out=$top/$name
stamp="$cc $cflags $profile $ver memory noerr smaller nofpo nosha1 pbc nosha224"
[ -f "$out/.done" ] && grep -qx "$stamp" "$out/.done" && exit 0
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
MBEDTLS_CIPHER_PADDING_ZEROS_AND_LEN MBEDTLS_CIPHER_PADDING_ZEROS MBEDTLS_PK_PARSE_EC_EXTENDED
MBEDTLS_LMS_C MBEDTLS_PKCS7_C MBEDTLS_SHA3_C MBEDTLS_SSL_KEYING_MATERIAL_EXPORT MBEDTLS_PK_PARSE_EC_COMPRESSED
MBEDTLS_SSL_TLS1_3_KEY_EXCHANGE_MODE_PSK_ENABLED MBEDTLS_SSL_TLS1_3_KEY_EXCHANGE_MODE_PSK_EPHEMERAL_ENABLED
MBEDTLS_PK_RSA_ALT_SUPPORT MBEDTLS_SSL_DTLS_CONNECTION_ID_COMPAT MBEDTLS_SSL_MAX_FRAGMENT_LENGTH MBEDTLS_SHA1_C
MBEDTLS_SHA224_C MBEDTLS_SSL_SERVER_NAME_INDICATION"
# TLS 1.3 on 3.6 needs the PSA core (not its key store)
[ "$ver" = 3.6 ] && SMALL=$(echo "$SMALL" | sed -E 's/(^| )MBEDTLS_PSA_CRYPTO_C( |$)/\1\2/')
src=$top/src
POOL=${DEBIAN_POOL:-http://deb.debian.org/debian/pool/main}
# Debian 12's source packages (and Debian 13's mbedtls 3.6), pinned
PKGS="mbedtls 2.28.3-1 3b4953aa55a681e084d31892d9904cc5328d6b4958ea57b90ae4b4f94ae69a8d 3e03c61f63c7bbcd0bf695b53e6663ab448cc2e15429cd67d0e4f32e699645a9 gz
protobuf-c 1.4.1-1 4cc4facd508172f3e0a4d3a8736225d472418aee35b4ad053384b137b220339f 7b303d1f1fb995fd242681db40f1415f368d14fe877b3c832ad1ca67b7db8096 gz
musl 1.2.3-1 7d5b0b6062521e4627e099e4c9dc8248d32a30285e959b7eecaa780cf8cfd4a4 8f12cc808dbec030179a25ce2645a4c0b622ee8011c2afcec53b87ec5867a8cc gz
mbedtls 3.6.6-0.1~deb13u1 8fb65fae8dcae5840f793c0a334860a411f884cc537ea290ce1c52bb64ca007a 210466c522eeebc85cf2f76bd5aef935b4ebac465559cc0a84f9e73a8ed6601c bz2"
# debsrc NAME VERSION: $src/NAME-UPSTREAM, unpacked once from the pinned files
debsrc() {
	echo "$PKGS" | while read -r n v osum dsum z; do
		[ "$n $v" = "$1 $2" ] || continue
		up=${v%-*} dir=$src/$n-${v%-*}
		[ -d "$dir" ] && exit 0
		d=$src/dl && mkdir -p "$d"
		for f in "${n}_$up.orig.tar.$z $osum" "${n}_$v.debian.tar.xz $dsum"; do
			set -- $f
			ok() { echo "$2  $d/$1" | sha256sum -c --quiet - >/dev/null 2>&1; }
			if ! ok "$@"; then
				echo "xlibs: fetching $POOL/$(echo "$n" | cut -c1)/$n/$1"
				curl -sSfL -o "$d/$1.part" "$POOL/$(echo "$n" | cut -c1)/$n/$1" && mv -f "$d/$1.part" "$d/$1" || rm -f "$d/$1.part"
			fi
			ok "$@" || {
				rm -f "$d/$1"
				echo "xlibs: no $1 with the pinned SHA-256 from $POOL: set $(echo "$n" | tr a-z- A-Z_)_SRC to a source tree you have"
				exit 1
			}
		done
		t=$(mktemp -d "$src/.unpack.XXXXXX")
		tar -xf "$d/${n}_$up.orig.tar.$z" -C "$t"
		top1=$(ls "$t") && mv "$t/$top1" "$t/s" && tar -xJf "$d/${n}_$v.debian.tar.xz" -C "$t/s"
		if [ -s "$t/s/debian/patches/series" ]; then
			command -v patch >/dev/null || { echo "xlibs: $n needs patch(1) to apply Debian's patches"; rm -rf "$t"; exit 1; }
			grep -v '^#' "$t/s/debian/patches/series" | while read -r p _; do
				[ -n "$p" ] && patch -s -p1 -d "$t/s" < "$t/s/debian/patches/$p"
			done
		fi
		mv "$t/s" "$dir" && rmdir "$t"
	done
}
mkdir -p "$src"
v2=$src/mbedtls-2.28.3 v36=$src/mbedtls-3.6.6
if [ -z "${MBEDTLS_SRC:-}" ]; then
	if [ "$ver" = 3.6 ]; then debsrc mbedtls 3.6.6-0.1~deb13u1; else debsrc mbedtls 2.28.3-1; fi
fi
[ -n "${PROTOBUF_C_SRC:-}" ] || debsrc protobuf-c 1.4.1-1
[ -n "${MUSL_SRC:-}" ] || [ "$name" != --sources ] || debsrc musl 1.2.3-1
[ "$name" = --sources ] && exit 0
msrc=${MBEDTLS_SRC:-$v2}/ conf=include/mbedtls/config.h
[ "$ver" = 3.6 ] && msrc=${MBEDTLS_SRC:-$v36}/ conf=include/mbedtls/mbedtls_config.h
[ -f "$msrc/$conf" ] || { echo "xlibs: $msrc is not an mbedtls $ver source tree (no $conf)"; exit 1; }
# gcc-ar for CC's target (it indexes LTO objects too), else CC's own ar
ar=$($cc -dumpmachine 2>/dev/null)-gcc-ar
command -v "$ar" >/dev/null || ar=$(echo "$cc" | sed -E 's/(gcc|cc)$/ar/')
command -v "$ar" >/dev/null || ar=ar
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
cp -r $msrc "$b/mbedtls"
cfg() { python3 "$b/mbedtls/scripts/config.py" -f "$b/mbedtls/$conf" "$@"; }
if [ "$profile" = small ]; then
	for o in $SMALL; do cfg unset $o; done
	cfg set MBEDTLS_AES_FEWER_TABLES
	cfg set MBEDTLS_SHA256_SMALLER
	cfg set MBEDTLS_SHA512_SMALLER
	# mbedtls' error strings (~20 KB) give way to "UNKNOWN ERROR CODE (xxxx)"
	cfg unset MBEDTLS_ERROR_C
	cfg set MBEDTLS_ERROR_STRERROR_DUMMY
	if [ "$ver" = 3.6 ]; then
		cfg set MBEDTLS_BLOCK_CIPHER_NO_DECRYPT # GCM and CTR_DRBG encrypt only
	fi
	# no precomputed multiples of each curve's generator in ROM (3.6: 15 KB
	# of tables on x86_64): key generation and ECDSA signing compute them,
	# once per handshake (README: Build).  The NIST curves' fast reductions
	# stay: 3 KB, and handshakes 2.7 times slower without them
	cfg set MBEDTLS_ECP_FIXED_POINT_OPTIM 0
fi
cfg set MBEDTLS_PLATFORM_MEMORY
# bn_mul.h's MIPS assembly is standard-ISA only: for MIPS16e code the C one
case "$cflags" in *-mips16*) cfg unset MBEDTLS_HAVE_ASM ;; esac
echo "xlibs: mbedtls $ver for $name ($cc $cflags, $profile configuration)"
# -w: mbedtls' own warnings are not kvd's to fix
make -s -C "$b/mbedtls/library" -j2 CC="$cc" AR="$ar" CFLAGS="$cflags -w -I../include" static >/dev/null
# CFLAGS without -flto...: aesni.c's inline assembly (its local labels) breaks
# in an LTO partition; protobuf-c stays an object of its own, linked last,
# beside libc (a replay runs both: kvd.c's KVD_RESIDENT)
nolto=$(echo "$cflags" | sed 's/-flto[^ ]*//g')
case "$cflags" in *-flto*)
	(cd "$b/mbedtls/library" && $cc $nolto -w -I../include -c aesni.c -o aesni.o && "$ar" rcs libmbedcrypto.a aesni.o) ;;
esac
rm -rf "$out"
mkdir -p "$out/lib" "$out/include/protobuf-c"
cp "$b"/mbedtls/library/lib*.a "$out/lib/"
cp -r "$b/mbedtls/include/mbedtls" "$out/include/"
[ -d "$b/mbedtls/include/psa" ] && cp -r "$b/mbedtls/include/psa" "$out/include/"
echo "xlibs: protobuf-c for $name"
p=${PROTOBUF_C_SRC:-$src/protobuf-c-1.4.1}/protobuf-c
[ -f "$p/protobuf-c.c" ] || { echo "xlibs: no protobuf-c.c in $p"; exit 1; }
$cc $nolto -I"$p/.." -c "$p/protobuf-c.c" -o "$b/protobuf-c.o"
rm -f "$out/lib/libprotobuf-c.a"
"$ar" rcs "$out/lib/libprotobuf-c.a" "$b/protobuf-c.o"
cp "$p/protobuf-c.h" "$out/include/protobuf-c/"
echo "$stamp" > "$out/.done"
