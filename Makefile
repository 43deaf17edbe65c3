# kvd - an etcd v3 (gRPC) daemon in one C file.  See README.md.
#
# Firmware trees: CC, CFLAGS, CPPFLAGS, LDFLAGS, LDLIBS, DESTDIR, PREFIX and
# CROSS_COMPILE are honoured; kvd's own flags go after yours (KVD_CFLAGS).

CROSS_COMPILE ?=
ifeq ($(origin CC),default)
CC = $(CROSS_COMPILE)gcc
endif
CFLAGS ?= -O2 -g
PREFIX ?= /usr/local
DESTDIR ?=
CLANG ?= clang
# builds of peers and libraries, outside the tree (test/lib/deps.sh, xlibs.sh)
KVD_CACHE ?= /var/cache/kvd-test
export KVD_CACHE
PYTHON ?= /usr/bin/python3
# kvd.h's KVD_VERSION: the tarball's name (make dist), the library's (make lib)
VERSION := $(shell sed -n 's/^.define KVD_VERSION "\(.*\)"/\1/p' kvd.h)
FUZZ_TIME ?= 60

WARN = -Wall -Wextra -Wshadow -Wundef -Wstrict-prototypes -Wmissing-prototypes \
       -Wpointer-arith -Wwrite-strings -Wformat=2
KVD_CFLAGS = -std=c99 $(WARN) -ffunction-sections -fdata-sections
KVD_LDFLAGS = -Wl,--gc-sections
# protobuf-c last: in a static link it then lies beside libc, the two a
# replay at start touches, in one run of pages (kvd.c's KVD_RESIDENT)
KVD_LIBS = -lmbedtls -lmbedx509 -lmbedcrypto -lprotobuf-c
# make TLS=0: no TLS (KVD_NO_TLS), only mbedcrypto linked
ifeq ($(TLS),0)
KVD_CFLAGS += -DKVD_NO_TLS
KVD_LIBS = -lmbedcrypto -lprotobuf-c
endif
# Parts a firmware may leave out, make X=0 for -DKVD_NO_X (README: Build):
#   CONFD     the Ganeti confd responder
#   RECIPES   Lock and Election (unknown services, as to grpc-go)
#   AUTH      users, roles, tokens, bcrypt: the Auth service is unknown, a
#             store or snapshot holding auth state is refused (implies JWT=0)
#   JWT       JWT tokens; without TLS, mbedtls' RSA, ECDSA, key parsing too
#   SNAPSHOT  snapshot files: Snapshot is Unimplemented, --restore-snapshot
#             and --snapshot-save refused (Hash and HashKV serve)
#   HTTP      HTTP/1.1: the JSON gateway, /health, /version, /metrics (a
#             request gets a 404 saying so)
#   NET       the network: no sockets, HTTP/2, gRPC framing, TLS, confd or
#             HTTP/1.1 -- the store and its services for a host's in-process
#             calls (make NET=0 lib); the daemon refuses to start.  Only
#             mbedcrypto and protobuf-c are linked
KNOBS = CONFD RECIPES AUTH JWT SNAPSHOT HTTP NET
ifeq ($(NET),0)
KVD_LIBS = -lmbedcrypto -lprotobuf-c
endif
KVD_CFLAGS += $(foreach x,$(KNOBS),$(if $(filter 0,$($(x))),-DKVD_NO_$(x)))

SAN = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TEST_CFLAGS = -O1 -g -Werror

SRC = kvd.c kvd.h $(wildcard proto/*.pb-c.[ch]) Makefile
PROTOS = kv auth rpc v3lock v3election health

.PHONY: libsize FORCE all lib nonet install-lib libcheck test k8s replica-campaign robustness unit check notls lean mbedtls36 asan cross cross-all footprint static-check fuzz fuzz-smoke run static install clean proto proto-gen proto-check symcheck toc toc-write size buildline

all: kvd

# Build and start on a fresh Debian machine: installs the build deps if
# missing, then runs kvd on 127.0.0.1:2379 with data in ./default.etcd.
run:
	./test/lib/deps.sh build
	$(MAKE) kvd
	./kvd $(ARGS)

# The compiler and flags of the last build of ./kvd, in .kvd-build: when a
# firmware tree changes CC, CROSS_COMPILE, CFLAGS, a knob or the libraries,
# kvd is built again rather than kept as "up to date" (and installed stale).
KVD_BUILD = $(CC) $(shell $(CC) -dumpmachine 2>/dev/null) | $(CPPFLAGS) $(CFLAGS) $(KVD_CFLAGS) | \
            $(LDFLAGS) $(KVD_LDFLAGS) $(LDLIBS) $(KVD_LIBS)
.kvd-build: FORCE
	@printf '%s\n' '$(subst ','\'',$(KVD_BUILD))' | cmp -s - $@ || \
	  printf '%s\n' '$(subst ','\'',$(KVD_BUILD))' > $@
FORCE:

kvd: $(SRC) .kvd-build
	$(CC) $(CPPFLAGS) $(CFLAGS) $(KVD_CFLAGS) -o $@ kvd.c $(LDFLAGS) $(KVD_LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# One self-contained executable for any Linux of this CPU: musl, static,
# with mbedtls and protobuf-c built for musl from Debian's source packages
# (test/lib/xlibs.sh, once, outside the tree; mbedtls configured small unless
# MBEDTLS_PROFILE=debian; Debian 13's 3.6, as OpenWrt 24.10, unless
# MBEDTLS_VERSION=2.28).  TLS=0 and CONFD=0 cut those for
# the smallest images; MUSL_CC=.../bin/musl-gcc builds for another CPU
# (test/footprint.sh makes such compilers).  make footprint: the README's table.
MUSL_CC ?= musl-gcc
# -Os, no unwind tables (C needs none: 80 KB), sections for --gc-sections in
# mbedtls too, no page-aligned code segment: 760 -> 590 KB with TLS.  -fno-pie:
# a -static link is loaded at a fixed address anyway, so Debian's default PIE
# code only cost size (mips, where it means GOT calls: 757 -> 709 KB).
# MUSL_LTO: mbedtls compiled for link-time optimisation, done in one
# partition when kvd links (x86_64 -9 KB, MIPS16e -16 KB); kvd.c is not (its
# gain was 2 KB, none on MIPS16e, and LTO's order of functions spread the code
# an idle kvd runs, KVD_RESIDENT, again: 388 -> 452 KiB of RSS), nor
# protobuf-c (test/lib/xlibs.sh keeps it beside libc).  No RELRO (nothing
# applies it in a static musl binary) and a 64-byte common page: the data
# segment follows the code in the file rather than at the next 4 KiB, so a
# byte saved is a byte in the file.
MUSL_CFLAGS ?= -Os -fno-asynchronous-unwind-tables -fno-unwind-tables -ffunction-sections -fdata-sections \
  -fmerge-all-constants -fno-pie
MUSL_LTO ?= -flto -flto-partition=one
# kvd.c at -Oz where the compiler has it (GCC 12, clang): on x86_64 3.8 KB
# less than -Os for 0.7% more instructions serving Puts and Ranges (callgrind);
# on mips and arm GCC makes the same code as at -Os
MUSL_KVD_OPT ?= $(shell $(MUSL_CC) -Oz -x c -c -o /dev/null /dev/null 2>/dev/null && echo -Oz)
MUSL_LDFLAGS ?= -no-pie -Wl,-z,noseparate-code -Wl,-z,norelro -Wl,-z,common-page-size=64 -Wl,--build-id=none
# MIPS16=1 (with a mips MUSL_CC): kvd, mbedtls and protobuf-c in the MIPS16e
# compressed ISA, as OpenWrt builds its packages for the 24Kc/74Kc/1004Kc
# cores of most MIPS routers (CONFIG_USE_MIPS16), interlinked with musl's
# standard-ISA libc: 709 -> 536 KB with TLS.  mbedtls' MIPS assembly is
# standard-ISA only, so its C bignum code serves (test/lib/xlibs.sh).
MIPS16 ?=
MUSL_CFLAGS += $(if $(filter 1,$(MIPS16)),-mips16 -minterlink-compressed)
MBEDTLS_PROFILE ?= small
MBEDTLS_VERSION ?= 3.6
MUSL_NAME = musl-$(shell $(MUSL_CC) -dumpmachine 2>/dev/null)$(if $(filter 1,$(MIPS16)),-mips16)-$(MBEDTLS_PROFILE)-mbedtls$(MBEDTLS_VERSION)
MUSL_DIR = $(KVD_CACHE)/$(MUSL_NAME)
static: kvd-static
kvd-static: $(SRC)
	@command -v $(MUSL_CC) >/dev/null || { echo "make static needs $(MUSL_CC): apt-get install musl-tools, or MUSL_CC=<a musl gcc>"; exit 1; }
	./test/lib/xlibs.sh $(MUSL_NAME) $(MUSL_CC) "$(MUSL_CFLAGS) $(MUSL_LTO)" $(MBEDTLS_PROFILE) $(MBEDTLS_VERSION)
	$(MUSL_CC) $(MUSL_CFLAGS) $(MUSL_KVD_OPT) $(KVD_CFLAGS) -I$(MUSL_DIR)/include -c -o $@.o kvd.c
	@# -w: mbedtls is compiled at this link, and its warnings are not kvd's
	$(MUSL_CC) $(MUSL_CFLAGS) $(MUSL_LTO) -w -o $@ $@.o -L$(MUSL_DIR)/lib -static -s $(KVD_LDFLAGS) $(MUSL_LDFLAGS) \
	  $(KVD_LIBS)
	@rm -f $@.o
	@ls -l $@ | awk '{print "$@: " $$5 " bytes, static, stripped"}'

footprint:
	./test/footprint.sh

# In make test: the static musl binary (small mbedtls) through the
# differential test against etcd, TLS with grpcio, and its idle RSS.
static-check:
	@if command -v $(MUSL_CC) >/dev/null; then $(MAKE) -B kvd-static && \
	  KVD=./kvd-static KVD_DIFF_OPS=2000 KVD_DIFF_SEEDS=5 $(PYTHON) test/diff.py && \
	  KVD=./kvd-static $(PYTHON) test/tls.py grpcio && \
	  KVD_STATIC=./kvd-static $(PYTHON) test/memory.py idle_rss; \
	else echo "static-check: SKIPPED ($(MUSL_CC) missing; test/lib/deps.sh test installs musl-tools)"; fi

# --- tests -------------------------------------------------------------------
# test/: the suites; test/lib/: what they and the build use (test/README.md).
# Unit tests #include kvd.c; -Werror here only, never in the default build.
test/test: test/test.c $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) -o $@ test/test.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# The inner loop: build and run the unit tests, only those whose name
# contains T if given (make unit T=hpack).
T ?=
unit: test/test
	./test/test $(T)

test/test-asan: test/test.c $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(SAN) $(KVD_CFLAGS) -o $@ test/test.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# The daemon with test-only methods (kvd.test.Test/*), under ASan+UBSan.
test/kvd-test: $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(SAN) $(KVD_CFLAGS) -DKVD_TEST_SERVICES -o $@ kvd.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# test/robustness.py's planted bugs: the test build with bug N of kvd.c's
# KVD_TEST_BUG (section 0) planted, which the harness must catch.  -O0, no
# sanitizers: six builds stay quick.
BUGS = 1 2 3 4 5 6
test/kvd-bug%: $(SRC)
	$(CC) $(CPPFLAGS) -O0 -g $(KVD_CFLAGS) -DKVD_TEST_SERVICES -DKVD_TEST_BUG=$* -o $@ kvd.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# etcd's guarantees under faults (test/robustness.py; in make test too):
# make robustness            the bounded run, kvd and the etcd 3.7.3 control
# make robustness BUG=N      against planted bug N: fails, naming the guarantee
# make robustness HOURS=H    a campaign: new seeds until H hours have passed
BUG ?=
HOURS ?=
robustness: test/kvd-test $(BUGS:%=test/kvd-bug%)
	./test/lib/deps.sh test
	$(PYTHON) test/robustness.py $(if $(BUG),--bug $(BUG)) $(if $(HOURS),--hours $(HOURS))

# mbedtls 3.6 (Debian 13's 3.6.6, as OpenWrt 24.10 ships), built static from
# its source package once (test/lib/xlibs.sh, outside the tree) with
# MBEDTLS_PLATFORM_MEMORY, so that its allocations are kvd's too: the unit
# tests (allocation sweeps, JWT signing, HMAC, the TLS sweep) under ASan, and
# the daemon through the TLS suite (TLS 1.3 beside etcd 3.7.3) and the JWT
# auth tests.  x86_64's default build stays on Debian 12's shared 2.28.
M36_NAME = gnu-$(shell $(CC) -dumpmachine 2>/dev/null)-mbedtls3.6
M36_DIR = $(KVD_CACHE)/$(M36_NAME)
M36_FLAGS = -I$(M36_DIR)/include
M36_LIBS = -L$(M36_DIR)/lib $(KVD_LIBS)
test/test-mbedtls36: test/test.c $(SRC) test/lib/xlibs.sh
	./test/lib/xlibs.sh $(M36_NAME) $(CC) "-O2 -g -fno-omit-frame-pointer" debian 3.6
	$(CC) $(TEST_CFLAGS) $(SAN) $(KVD_CFLAGS) $(M36_FLAGS) -o $@ test/test.c $(M36_LIBS)
test/kvd-mbedtls36: $(SRC) test/lib/xlibs.sh
	./test/lib/xlibs.sh $(M36_NAME) $(CC) "-O2 -g -fno-omit-frame-pointer" debian 3.6
	$(CC) -O2 -g -Werror $(KVD_CFLAGS) $(M36_FLAGS) -DKVD_TEST_SERVICES -o $@ kvd.c $(KVD_LDFLAGS) $(M36_LIBS)
mbedtls36: test/test-mbedtls36 test/kvd-mbedtls36
	T_TLS_SWEEP=all ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=test/lib/lsan.supp ./test/test-mbedtls36 \
	  > test/mbedtls36.log 2>&1 || { tail -40 test/mbedtls36.log; exit 1; }
	grep -E 'tls_oom_sweep:|passed' test/mbedtls36.log
	./test/kvd-mbedtls36 --version | grep -q 'tls=mbedtls-3.6.*+tls1.3'
	KVD=./test/kvd-mbedtls36 KVD_TEST=./test/kvd-mbedtls36 $(PYTHON) test/tls.py
	for t in jwt client_certificate_cn hostile_tokens; do \
	  KVD=./test/kvd-mbedtls36 KVD_TEST=./test/kvd-mbedtls36 $(PYTHON) test/auth.py $$t || exit 1; done

# The build without TLS (KVD_NO_TLS, make TLS=0) must stay whole: it builds,
# links only mbedcrypto, and says so; an https:// URL is refused.
notls: test/kvd-notls
test/kvd-notls: $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) -DKVD_NO_TLS -o $@ kvd.c $(LDFLAGS) -lprotobuf-c -lmbedcrypto
	./test/kvd-notls --version | grep -q 'tls=no'
	! ./test/kvd-notls --listen-client-urls https://127.0.0.1:1 --data-dir /nonexistent/x 2>&1 | grep -v 'built without TLS'

# The knobs that leave a part out for a small image (RECIPES=0, AUTH=0,
# JWT=0, SNAPSHOT=0, HTTP=0): each alone compiles warning-free, and all five
# in one build (the footprint's "every knob") say so, answer what they left
# out with a clear Unimplemented, 404 or refusal while the rest serves (each
# suite's left_out, the full build its control), and pass the differential
# test against etcd.  AUTH=0 and JWT=0 are built alone too: the one for the
# snapshots and gateway paths the lean build has not, the other for simple
# tokens serving where JWTs are refused.
LEAN = -DKVD_NO_RECIPES -DKVD_NO_AUTH -DKVD_NO_JWT -DKVD_NO_SNAPSHOT -DKVD_NO_HTTP
lean: test/kvd-lean test/kvd-noauth test/kvd-nojwt
	for d in $(LEAN); do $(CC) $(CPPFLAGS) -O0 -Werror $(KVD_CFLAGS) $$d -c -o /dev/null kvd.c || exit 1; done
	$(CC) $(CPPFLAGS) -O0 -Werror $(KVD_CFLAGS) $(LEAN) -DKVD_NO_TLS -DKVD_NO_CONFD -c -o /dev/null kvd.c
	./test/kvd-lean --version | grep -q 'recipes=no auth=no jwt=no snapshot=no http=no'
	KVD=./test/kvd-lean KVD_TEST=./test/kvd-lean KVD_NORECIPES=1 $(PYTHON) test/lock.py left_out
	KVD=./test/kvd-lean KVD_TEST=./test/kvd-lean KVD_NOAUTH=1 $(PYTHON) test/auth.py auth_left_out
	KVD=./test/kvd-lean KVD_NOSNAPSHOT=1 $(PYTHON) test/snapshot.py left_out
	KVD=./test/kvd-lean KVD_NOHTTP=1 $(PYTHON) test/http1.py left_out
	KVD=./test/kvd-lean KVD_DIFF_OPS=1000 KVD_DIFF_SEEDS=3 $(PYTHON) test/diff.py
	KVD=./test/kvd-noauth KVD_TEST=./test/kvd-noauth KVD_NOAUTH=1 $(PYTHON) test/auth.py auth_left_out
	KVD=./test/kvd-nojwt KVD_TEST=./test/kvd-nojwt KVD_NOJWT=1 $(PYTHON) test/auth.py jwt_left_out
test/kvd-lean: $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) $(LEAN) -o $@ kvd.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)
test/kvd-noauth: $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) -DKVD_NO_AUTH -o $@ kvd.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)
test/kvd-nojwt: $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) -DKVD_NO_JWT -o $@ kvd.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# Fuzz targets replayed over their corpus without libFuzzer (any compiler).
FUZZERS = h2 hpack log json confd pb bolt auth http1 config embed repl
test/replay-%: test/fuzz_%.c test/lib/fuzz_replay.c test/lib/fuzz.h $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(SAN) $(KVD_CFLAGS) -DKVD_CHECKS=1 -o $@ test/fuzz_$*.c test/lib/fuzz_replay.c $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# Watch load generator for test/bench.py (plain C, no kvd code inside).
test/watchbench: test/lib/watchbench.c
	$(CC) $(CPPFLAGS) -O2 -g $(WARN) -o $@ test/lib/watchbench.c $(LDFLAGS) $(LDLIBS)

# in-process calls beside loopback gRPC, one instance, for test/bench.py --only embed
test/embedbench: test/lib/embedbench.c $(SRC)
	$(CC) $(CPPFLAGS) -O2 -g -std=c99 $(WARN) -DKVD_NO_MAIN -o $@ test/lib/embedbench.c -x c kvd.c -x none \
	  $(LDFLAGS) $(LDLIBS) $(KVD_LIBS)

# confd load generator for test/bench.py (plain C and mbedtls, no kvd code inside).
test/confdbench: test/lib/confdbench.c
	$(CC) $(CPPFLAGS) -O2 -g $(WARN) -o $@ test/lib/confdbench.c $(LDFLAGS) $(LDLIBS) -lmbedcrypto

# A host daemon embedding kvd (test/embed.py): kvd.c with KVD_NO_MAIN under
# ASan+UBSan, driven by poll, epoll (edge), libev, libuv or sd-event.
EMBED_LIBS = -lev -luv -lsystemd
test/embed: test/embed.c $(SRC)
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(SAN) $(KVD_CFLAGS) -DKVD_NO_MAIN -o $@ test/embed.c kvd.c $(LDFLAGS) $(LDLIBS) \
	  $(EMBED_LIBS) $(KVD_LIBS)

# The corpora are replayed on a 256 KiB stack (routers run with small ones):
# a recursion an input can drive fails here, not on a board.
REPLAY_STACK_KIB ?= 256
asan:
	$(MAKE) -j2 test/test-asan $(FUZZERS:%=test/replay-%)  # two builds at a time: CI has 2 CPUs
	ASAN_OPTIONS=detect_leaks=1 ./test/test-asan
	for f in $(FUZZERS); do (ulimit -s $(REPLAY_STACK_KIB) && ASAN_OPTIONS=detect_leaks=1 \
	  ./test/replay-$$f test/corpus/$$f) || exit 1; done

# The one test command (README): installs missing Debian packages (test peers
# included), then unit tests, sanitizers, corpus replay, a short libFuzzer
# run, proto freshness, symbols, TOC, and interop/abuse against real clients.
test:
	./test/lib/deps.sh test
	$(MAKE) check

check: kvd test/test test/kvd-test test/embed $(BUGS:%=test/kvd-bug%) notls nonet libcheck lean mbedtls36 asan fuzz-smoke cross static-check proto-check symcheck toc buildline
	./test/test
	./test/run.sh

# Kubernetes v1.37.2's control plane and kine on kvd and etcd 3.7.3 (test/k8s.py):
# builds them from Go modules once per machine (test/lib/k8s-deps.sh), cached
# outside the tree.  CI runs it after `make test`.
k8s: kvd test/kvd-test
	./test/lib/deps.sh test
	KVD=./kvd KVD_TEST=./test/kvd-test /usr/bin/python3 test/k8s.py

# The replica's long fault campaign (test/replica_campaign.py): rounds of a
# 3-member etcd 3.7.3 cluster under writers while members are killed and
# stopped, the link is cut and stalled, kvd is killed and the cluster
# compacts; HashKV, Range, watches and every acknowledged write checked.
# MINUTES (60) long; not in `make test` (its bounded twin is there).
MINUTES ?= 60
replica-campaign: kvd
	./test/lib/deps.sh test
	KVD=./kvd MINUTES=$(MINUTES) /usr/bin/python3 test/replica_campaign.py

# The CPUs routers and boards use, other word sizes and byte orders, under
# qemu-user: the unit tests built for i386 (Debian multiarch), then mips
# (32-bit big-endian, all in MIPS16e) and armhf through test/cross.sh: mbedtls and
# protobuf-c built from Debian's source, the unit tests and the daemon static,
# the daemon through the differential test against etcd.  cross-all adds
# mipsel, arm64 and s390x (slower; not in make test).
XINC = -idirafter /usr/include  # protobuf-c and mbedtls headers, after the cross sysroot
cross: $(SRC) test/test.c
	@if command -v i686-linux-gnu-gcc >/dev/null; then \
	  i686-linux-gnu-gcc $(TEST_CFLAGS) $(KVD_CFLAGS) $(XINC) -L/usr/lib/i386-linux-gnu \
	    -o test/test-i386 test/test.c $(KVD_LIBS) && ./test/test-i386 | tail -1; \
	else echo "cross i386: SKIPPED (i686-linux-gnu-gcc missing; test/lib/deps.sh test installs it)"; fi
	./test/cross.sh mips armhf

cross-all: cross
	./test/lib/deps.sh cross-all
	./test/cross.sh mipsel arm64
	s390x-linux-gnu-gcc $(TEST_CFLAGS) $(KVD_CFLAGS) $(XINC) -L/usr/lib/s390x-linux-gnu \
	  -o test/test-s390x test/test.c $(KVD_LIBS)
	T_LIFE_PUTS=300000 qemu-s390x -L / test/test-s390x
	s390x-linux-gnu-gcc -O2 $(KVD_CFLAGS) $(XINC) -L/usr/lib/s390x-linux-gnu -o test/kvd-s390x kvd.c $(KVD_LIBS)
	KVD=test/lib/kvd-x.sh KVD_X=s390x KVD_DIFF_OPS=2000 KVD_DIFF_SEEDS=77 $(PYTHON) test/diff.py

fuzz-smoke:
	$(MAKE) fuzz FUZZ_TIME=10 FUZZ_CORPUS=/tmp/kvd-fuzz-smoke

# libFuzzer (clang): FUZZ_TIME seconds per target.  New inputs go to
# FUZZ_CORPUS (default: the committed corpus, which then grows).
FUZZ_CORPUS ?= test/corpus
fuzz:
	$(MAKE) -j2 $(FUZZERS:%=test/fuzz-%)
	for f in $(FUZZERS); do mkdir -p $(FUZZ_CORPUS)/$$f; \
	  ./test/fuzz-$$f -max_total_time=$(FUZZ_TIME) -artifact_prefix=test/crash- $(FUZZ_CORPUS)/$$f test/corpus/$$f \
	    > test/fuzz-$$f.log 2>&1 || { tail -40 test/fuzz-$$f.log; exit 1; }; \
	  echo "fuzz-$$f: $$(grep -c . test/fuzz-$$f.log) log lines, $$(grep -o 'Done [0-9]* runs' test/fuzz-$$f.log)"; done
test/fuzz-%: test/fuzz_%.c test/lib/fuzz.h $(SRC)
	$(CLANG) -O1 -g -fsanitize=fuzzer,address,undefined -DKVD_CHECKS=1 -o $@ test/fuzz_$*.c $(KVD_LIBS)

# --- generated protobuf-c code (committed; firmware builds need no protoc) ---
# proto/<f>.pb-c.[ch] from proto/<f>.proto; and proto/<f>.noname.pb-c.c, the
# same with optimize_for = CODE_SIZE (no names: what KVD_NO_HTTP builds use;
# its headers are byte-identical, checked), protoc-c's output only renamed.
proto: proto-gen
	for f in $(PROTOS); do cp $(PROTO_TMP)/$$f.pb-c.c $(PROTO_TMP)/$$f.pb-c.h proto/ && \
	  cp $(PROTO_TMP)/noname/$$f.pb-c.c proto/$$f.noname.pb-c.c; done; rm -rf $(PROTO_TMP)

PROTO_TMP = /tmp/kvd-proto.$(shell id -u)
proto-gen:
	@command -v protoc-c >/dev/null || { echo "protoc-c missing"; exit 1; }
	@rm -rf $(PROTO_TMP) && mkdir -p $(PROTO_TMP)/noname && cp proto/*.proto $(PROTO_TMP) && \
	for f in $(PROTOS); do sed '0,/^package /s//option optimize_for = CODE_SIZE;\npackage /' proto/$$f.proto \
	  > $(PROTO_TMP)/noname/$$f.proto; done && \
	(cd $(PROTO_TMP) && protoc-c --c_out=. $(PROTOS:%=%.proto)) && \
	(cd $(PROTO_TMP)/noname && protoc-c --c_out=. $(PROTOS:%=%.proto)) && \
	for f in $(PROTOS); do cmp -s $(PROTO_TMP)/$$f.pb-c.h $(PROTO_TMP)/noname/$$f.pb-c.h || \
	  { echo "$$f: CODE_SIZE changed the header"; exit 1; }; \
	  grep -q CODE_SIZE $(PROTO_TMP)/noname/$$f.pb-c.c || { echo "$$f: no CODE_SIZE output"; exit 1; }; done

proto-check: proto-gen
	@for f in $(PROTOS); do for x in pb-c.c pb-c.h; do \
	  cmp -s $(PROTO_TMP)/$$f.$$x proto/$$f.$$x || { echo "proto/$$f.$$x is stale: run make proto"; exit 1; }; done; \
	  cmp -s $(PROTO_TMP)/noname/$$f.pb-c.c proto/$$f.noname.pb-c.c || \
	  { echo "proto/$$f.noname.pb-c.c is stale: run make proto"; exit 1; }; \
	done; rm -rf $(PROTO_TMP); echo "proto-check: generated code is current"

# Only kvd_* (and the generated protobuf-c namespaces) may be exported.
symcheck: kvd
	@bad=$$(nm -g --defined-only kvd | awk '$$2 ~ /[TDBR]/ && $$3 !~ /@/ {print $$3}' | \
	  grep -Ev '^(kvd_|etcdserverpb__|mvccpb__|authpb__|v3lockpb__|v3electionpb__|grpc__health__v1__|main$$|_)' ); \
	if [ -n "$$bad" ]; then echo "symcheck: unexpected exports: $$bad"; exit 1; fi; echo "symcheck: ok"

# The table of contents must list the section banners, in order.
# The one-line build kvd.c's header and README.md give, built as given.
buildline:
	@l=$$(sed -n 's/^ \* Build:  make  *or  *//p' kvd.c); \
	r=$$(grep -o 'Or by hand: `[^`]*`' README.md | sed 's/^Or by hand: `//; s/`$$//'); \
	if [ -z "$$l" ] || [ "$$l" != "$$r" ]; then echo "buildline: kvd.c gives '$$l', README.md '$$r'"; exit 1; fi; \
	d=$$(mktemp -d) && cp -r kvd.c kvd.h proto $$d && (cd $$d && eval "$$l" && ./kvd --version >/dev/null) && \
	rm -rf $$d && echo "buildline: ok ($$l)" || { echo "buildline: '$$l' does not build kvd"; rm -rf $$d; exit 1; }

# The table of contents is an index (sections, their sub-banners, the "where
# is" paths): test/lib/toc.py checks it against the file; toc-write rewrites it.
# Every numbered invariant is kept by a check or a test: test/lib/invariants.py.
toc:
	@$(PYTHON) test/lib/toc.py kvd.c
	@$(PYTHON) test/lib/testindex.py test/README.md
	@$(PYTHON) test/lib/invariants.py kvd.c

toc-write:
	@$(PYTHON) test/lib/toc.py --write kvd.c
	@$(PYTHON) test/lib/testindex.py --write test/README.md

size: kvd
	@size kvd; strip -o kvd.stripped kvd && ls -l kvd.stripped | awk '{print "stripped:", $$5, "bytes"}'; rm -f kvd.stripped

install: kvd
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include
	install -m 755 kvd $(DESTDIR)$(PREFIX)/bin/kvd
	install -m 644 kvd.h $(DESTDIR)$(PREFIX)/include/kvd.h

# --- libkvd: kvd.c as a library (README: Embedding) --------------------------
# make lib: libkvd.a, libkvd.so (libkvd.so.$(VERSION), SONAME libkvd.so.0, and
# its two links) and kvd.pc, from kvd.c compiled twice with KVD_NO_MAIN and
# hidden visibility, kvd.h's KVD_API (KVD_BUILD_LIB) alone default: without
# -fPIC for the archive (PIC costs more on MIPS), with it for the .so.  In the
# archive every hidden symbol is made local (objcopy --localize-hidden): the
# generated protobuf-c descriptors (etcdserverpb__*, mvccpb__*, ...) cannot
# clash with a host's own etcd protos in a static link.  The .so exports
# kvd_* alone (libkvd.map, one version node).  The knobs apply (make NET=0
# lib: the library without the network); kvd.pc's Libs.private follows them.
# make libcheck: both export kvd_* only, and test/libkvd.c links against each.
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
ifeq ($(origin AR),default)
AR = $(CROSS_COMPILE)ar
endif
OBJCOPY ?= $(CROSS_COMPILE)objcopy
NM ?= $(CROSS_COMPILE)nm
PKG_CONFIG ?= pkg-config
LIB_CFLAGS = -DKVD_NO_MAIN -DKVD_BUILD_LIB -fvisibility=hidden
LIB_SONAME = libkvd.so.0
LIB_SO = libkvd.so.$(VERSION)
LIB_OUT = libkvd.a libkvd.so $(LIB_SONAME) $(LIB_SO) kvd.pc

lib: $(LIB_OUT)

# The README's library sizes (Embedding): libkvd.so's text with and without
# the network, x86_64 and MIPS16e (test/libsize.sh; not in make test).
libsize:
	./test/libsize.sh

libkvd.o: $(SRC) .kvd-build
	$(CC) $(CPPFLAGS) $(CFLAGS) $(KVD_CFLAGS) $(LIB_CFLAGS) -c -o $@ kvd.c
	$(OBJCOPY) --localize-hidden $@
libkvd.a: libkvd.o
	rm -f $@ && $(AR) rcs $@ libkvd.o
libkvd.pic.o: $(SRC) .kvd-build
	$(CC) $(CPPFLAGS) $(CFLAGS) $(KVD_CFLAGS) $(LIB_CFLAGS) -fPIC -c -o $@ kvd.c
libkvd.map: Makefile
	printf 'KVD_0 {\n\tglobal: kvd_*;\n\tlocal: *;\n};\n' > $@
$(LIB_SO): libkvd.pic.o libkvd.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(LIB_SONAME) -Wl,--version-script=libkvd.map $(KVD_LDFLAGS) \
	  -o $@ libkvd.pic.o $(LDLIBS) $(KVD_LIBS)
$(LIB_SONAME): $(LIB_SO)
	ln -sf $(LIB_SO) $@
libkvd.so: $(LIB_SONAME)
	ln -sf $(LIB_SONAME) $@
# every directory from ${prefix}, as OpenWrt's pkg-config wrapper redefines
# it; the libraries as Libs.private (Debian's mbedtls has no .pc to require)
kvd.pc: Makefile kvd.h .kvd-build
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' \
	  'libdir=$(patsubst $(PREFIX)/%,$${exec_prefix}/%,$(LIBDIR))' \
	  'includedir=$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))' '' \
	  'Name: kvd' 'Description: an etcd v3 key-value server as a library (kvd.c)' 'Version: $(VERSION)' \
	  'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lkvd' 'Libs.private: $(KVD_LIBS)' > $@

# Both artifacts export kvd_* alone, the .so names its SONAME, and a host
# program (test/libkvd.c) builds against each: against libkvd.a through
# pkg-config --static and kvd.pc, against libkvd.so run from the tree.
libcheck: lib
	@bad=$$($(NM) -g --defined-only libkvd.a libkvd.so | awk 'NF == 3 && $$3 != "KVD_0" {print $$3}' | grep -v '^kvd_'); \
	if [ -n "$$bad" ]; then echo "libcheck: exported besides kvd_*:" $$bad; exit 1; fi
	@readelf -d libkvd.so | grep -q 'SONAME.*\[$(LIB_SONAME)\]' || { echo "libcheck: no SONAME $(LIB_SONAME)"; exit 1; }
	rm -rf test/libkvd-stage && $(MAKE) -s install-lib DESTDIR=$(CURDIR)/test/libkvd-stage PREFIX=/usr
	@# as OpenWrt's pkg-config wrapper: the staging dir's prefix redefined
	st=test/libkvd-stage/usr; pc="$(PKG_CONFIG) --define-variable=prefix=$(CURDIR)/$$st" && export PKG_CONFIG_PATH=$$st/lib/pkgconfig && \
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(WARN) $$($$pc --cflags kvd) -o test/libkvd-shared test/libkvd.c $$($$pc --libs kvd) && \
	LD_LIBRARY_PATH=$$st/lib ./test/libkvd-shared && rm $$st/lib/libkvd.so* && \
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(WARN) $$($$pc --cflags kvd) -o test/libkvd-static test/libkvd.c $$($$pc --static --libs kvd) && \
	./test/libkvd-static && ! readelf -d test/libkvd-static | grep -q 'NEEDED.*libkvd'
	@echo "libcheck: ok (kvd_* alone exported by libkvd.a and libkvd.so; test/libkvd.c linked to each)"

# The build without the network (KVD_NO_NET) compiles warning-free, with the
# other knobs too, calls no bind(), listen(), accept() or connect(), links
# with mbedcrypto and protobuf-c alone, and serves a host (test/libkvd.c:
# it opens and polls with nothing bound).
nonet:
	$(CC) $(CPPFLAGS) -O1 -Werror $(KVD_CFLAGS) -DKVD_NO_NET -DKVD_NO_RECIPES -DKVD_NO_AUTH -DKVD_NO_SNAPSHOT \
	  -DKVD_NO_MAIN -c -o /dev/null kvd.c
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(KVD_CFLAGS) -DKVD_NO_NET -DKVD_NO_MAIN -c -o test/nonet.o kvd.c
	@# (socket() and sendto() stay: --log-outputs syslog, a datagram to /dev/log)
	@if $(NM) -u test/nonet.o | grep -Ew '(bind|listen|accept4?|connect)$$'; then echo "nonet: the network is called"; exit 1; fi
	$(CC) $(CPPFLAGS) $(TEST_CFLAGS) $(WARN) -I. -DKVD_NO_NET -o test/libkvd-nonet test/libkvd.c test/nonet.o \
	  $(LDFLAGS) -lmbedcrypto -lprotobuf-c
	./test/libkvd-nonet

install-lib: lib
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 kvd.h $(DESTDIR)$(INCLUDEDIR)/kvd.h
	install -m 644 libkvd.a $(DESTDIR)$(LIBDIR)/libkvd.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(LIB_SO)
	ln -sf $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libkvd.so
	install -m 644 kvd.pc $(DESTDIR)$(LIBDIR)/pkgconfig/kvd.pc

# --- the source tarball and the package directories (README: Packages) -------
# make dist: PKG_OUT/kvd-$(VERSION).tar.gz from the working tree's files (no
# git needed), the same bytes each time: names sorted, times 0, owner 0,
# modes 644, gzip without a name or time.  make packages (or one of
# package-openwrt, -buildroot, -yocto, -systemd, -sysvinit): the package
# directories in PKG_OUT, their text README.md's blocks with @VERSION@,
# @URL@ (KVD_SOURCE_URL: the directory the tarball is fetched from; by
# default PKG_OUT itself, file://), @SHA256@ (the tarball's), @LICENSE_MD5@
# and @LICENSE_SHA256@ filled in.  awk, sed, tar, gzip, sha256sum, md5sum only.
PKG_OUT ?= pkg
KVD_SOURCE_URL ?= file://$(abspath $(PKG_OUT))
DIST = kvd-$(VERSION)
DIST_TAR = $(PKG_OUT)/$(DIST).tar.gz
DIST_FILES = kvd.c kvd.h Makefile LICENSE README.md $(sort $(wildcard proto/*.proto proto/*.pb-c.[ch]))
PKG_TARGETS = openwrt buildroot yocto systemd sysvinit
PKG_URL = $(patsubst %/,%,$(subst &,\&,$(KVD_SOURCE_URL)))
PKG_BR = $(PKG_OUT)/buildroot/package/kvd
PKG_YOCTO = $(PKG_OUT)/yocto/recipes-support/kvd
# the packages install /usr/bin/kvd; systemd/ and sysvinit/ name make install's
PKG_USR_BIN = -e 's|/usr/local/bin/kvd|/usr/bin/kvd|g'
PKG_PREFIX_BIN = -e 's|/usr/local/bin/kvd|$(PREFIX)/bin/kvd|g'
.PHONY: dist packages $(PKG_TARGETS:%=package-%)

dist: $(DIST_TAR)
$(DIST_TAR): $(DIST_FILES)
	@test -n "$(VERSION)" || { echo "dist: no KVD_VERSION in kvd.h"; exit 1; }
	@mkdir -p $(PKG_OUT)
	LC_ALL=C tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu --mode=a=rX,u+w \
	  --transform 's,^,$(DIST)/,' -cf $(PKG_OUT)/.dist.tar $(DIST_FILES)
	gzip -n9 < $(PKG_OUT)/.dist.tar > $@.tmp && rm -f $(PKG_OUT)/.dist.tar && mv $@.tmp $@
	@sha256sum $@

# the shell variables $(call pkg_block) fills the sums in from
pkg_sums = sha=$$(sha256sum < $(DIST_TAR) | cut -d' ' -f1) && lsha=$$(sha256sum < LICENSE | cut -d' ' -f1) && \
  lmd5=$$(md5sum < LICENSE | cut -d' ' -f1)
# $(call pkg_block,NAME,FILE[,MODE[,SED]]): README.md's block NAME, filled in
# (and SED's expressions applied), to FILE; a block missing or a placeholder
# left is an error
pkg_block = mkdir -p $(dir $(2)) && \
  awk -v b='<!-- block: $(1) -->' 'f == 2 && /^```$$/ { f = 3; exit } f == 2 { print } f == 1 { f = 2 } \
    $$0 == b { f = 1 } END { if (f != 3) { print "README.md has no block $(1)" > "/dev/stderr"; exit 1 } }' \
    README.md > $(2).tmp && \
  sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@URL@|$(PKG_URL)|g' -e "s|@SHA256@|$$sha|g" -e "s|@LICENSE_MD5@|$$lmd5|g" \
    -e "s|@LICENSE_SHA256@|$$lsha|g" $(4) $(2).tmp > $(2) && rm -f $(2).tmp && chmod $(or $(3),644) $(2) && \
  { if grep -n '@[A-Z0-9_]*@' $(2); then echo "$(2): a placeholder is left"; exit 1; fi; }

packages: $(PKG_TARGETS:%=package-%)

package-openwrt: $(DIST_TAR)
	@$(pkg_sums) && \
	$(call pkg_block,openwrt-makefile,$(PKG_OUT)/openwrt/kvd/Makefile) && \
	$(call pkg_block,procd-init,$(PKG_OUT)/openwrt/kvd/files/kvd.init,755) && \
	$(call pkg_block,uci-config,$(PKG_OUT)/openwrt/kvd/files/kvd.config)
	@echo "$(PKG_OUT)/openwrt: a feed (src-link) with the package kvd"

package-buildroot: $(DIST_TAR)
	@$(pkg_sums) && \
	$(call pkg_block,buildroot-external-desc,$(PKG_OUT)/buildroot/external.desc) && \
	$(call pkg_block,buildroot-external-config-in,$(PKG_OUT)/buildroot/Config.in) && \
	$(call pkg_block,buildroot-external-mk,$(PKG_OUT)/buildroot/external.mk) && \
	$(call pkg_block,buildroot-config-in,$(PKG_BR)/Config.in) && \
	$(call pkg_block,buildroot-mk,$(PKG_BR)/kvd.mk) && \
	$(call pkg_block,buildroot-hash,$(PKG_BR)/kvd.hash) && \
	$(call pkg_block,sysvinit,$(PKG_BR)/S95kvd,755,$(PKG_USR_BIN)) && \
	$(call pkg_block,systemd-unit,$(PKG_BR)/kvd.service,644,$(PKG_USR_BIN))
	@echo "$(PKG_OUT)/buildroot: a BR2_EXTERNAL tree with the package kvd"

package-yocto: $(DIST_TAR)
	@rm -f $(PKG_YOCTO)/kvd_*.bb && $(pkg_sums) && \
	$(call pkg_block,yocto-layer-conf,$(PKG_OUT)/yocto/conf/layer.conf) && \
	$(call pkg_block,yocto-recipe,$(PKG_YOCTO)/kvd_$(VERSION).bb) && \
	$(call pkg_block,systemd-unit,$(PKG_YOCTO)/files/kvd.service,644,$(PKG_USR_BIN)) && \
	$(call pkg_block,sysvinit,$(PKG_YOCTO)/files/kvd.init,755,$(PKG_USR_BIN))
	@echo "$(PKG_OUT)/yocto: a layer (bitbake-layers add-layer) with the recipe kvd_$(VERSION).bb"

package-systemd: $(DIST_TAR)
	@$(pkg_sums) && $(call pkg_block,systemd-unit,$(PKG_OUT)/systemd/kvd.service,644,$(PKG_PREFIX_BIN))
	@echo "$(PKG_OUT)/systemd/kvd.service: for $(PREFIX)/bin/kvd"

package-sysvinit: $(DIST_TAR)
	@$(pkg_sums) && $(call pkg_block,sysvinit,$(PKG_OUT)/sysvinit/kvd,755,$(PKG_PREFIX_BIN))
	@echo "$(PKG_OUT)/sysvinit/kvd: for $(PREFIX)/bin/kvd"

clean:
	rm -f kvd .kvd-build kvd-static test/test test/test-asan test/test-i386 test/test-s390x test/kvd-s390x test/test-mips* test/kvd-mips* test/test-arm* test/kvd-arm* test/cross-*.log test/kvd-test test/kvd-bug* test/kvd-mbedtls36 test/test-mbedtls36 test/mbedtls36.log test/kvd-lean test/kvd-noauth test/kvd-nojwt test/watchbench test/embedbench test/confdbench test/replay-* $(FUZZERS:%=test/fuzz-%) test/*.log .toc.* \
	  $(LIB_OUT) libkvd.o libkvd.pic.o libkvd.map test/libkvd-shared test/libkvd-static test/libkvd-nonet test/nonet.o
	rm -rf test/libkvd-stage
