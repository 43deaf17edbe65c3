#!/bin/sh
# test/bench.sh - kvd and Debian's etcd side by side, same h2load calls.
# A benchmark, not a test: it prints figures and ratios (README records them).
#   test/bench.sh [N]     N requests per run (default 100000)
set -u
cd "$(dirname "$0")/.." || exit 1
N=${1:-100000}
KVD=${KVD:-./kvd}
TMP=$(mktemp -d /tmp/kvd-bench.XXXXXX)
EP=23990
KP=23991
trap 'kill $EPID $KPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT INT TERM

etcd --name bench --data-dir "$TMP/etcd" --listen-client-urls http://127.0.0.1:$EP \
	--advertise-client-urls http://127.0.0.1:$EP --listen-peer-urls http://127.0.0.1:23992 \
	>"$TMP/etcd.log" 2>&1 &
EPID=$!
$KVD --name bench --data-dir "$TMP/kvd" --listen-client-urls http://127.0.0.1:$KP \
	--advertise-client-urls http://127.0.0.1:$KP >"$TMP/kvd.log" 2>&1 &
KPID=$!
for i in $(seq 50); do
	ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:$EP endpoint status >/dev/null 2>&1 &&
	ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:$KP endpoint status >/dev/null 2>&1 && break
	sleep 0.2
done
sleep 1

rss() { awk '/^VmRSS/ {print $2}' /proc/$1/status; }
anon() { awk '/^RssAnon/ {print $2}' /proc/$1/status; }
printf '\0\0\0\0\0' > "$TMP/empty.bin"

echo "kvd $($KVD --version | head -1 | cut -d' ' -f3) vs $(etcd --version | head -1)"
echo "machine: $(nproc) CPUs, $(uname -m); h2load -t 1, $N requests per run"
echo
echo "idle RSS: etcd $(rss $EPID) KiB (anon $(anon $EPID)), kvd $(rss $KPID) KiB (anon $(anon $KPID))"
echo "binary:   etcd $(stat -c %s "$(command -v etcd)") bytes, kvd $(stat -c %s $KVD) bytes"
echo

ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
HZ=$(getconf CLK_TCK)
run() { # pid port path c m -> "req/s cpu-us-per-call"
	t0=$(ticks $1)
	r=$(h2load -n "$N" -c "$4" -m "$5" -t 1 -d "$TMP/empty.bin" -H 'content-type: application/grpc' \
		-H 'te: trailers' "http://127.0.0.1:$2$3" 2>/dev/null |
		awk '/^finished in/ {gsub(",", "", $4); r=$4} /^requests:/ {if ($10 != 0 || $12 != 0) r="ERR"} END {print r}')
	t1=$(ticks $1)
	echo "$r $(awk -v t=$((t1 - t0)) -v hz=$HZ -v n=$N 'BEGIN {printf "%.1f", t * 1e6 / hz / n}')"
}
echo "h2load runs on one core; the server's CPU time per call shows its own cost"
echo "even when h2load is the bottleneck."
printf '%-44s %11s %11s %7s %9s %9s %7s\n' "call" "etcd req/s" "kvd req/s" "ratio" "etcd us" "kvd us" "ratio"
for path in /grpc.health.v1.Health/Check /etcdserverpb.Maintenance/Status; do
	for cm in "1 1" "16 8"; do
		set -- $cm
		e=$(run $EPID $EP $path "$1" "$2")
		k=$(run $KPID $KP $path "$1" "$2")
		printf '%-44s %11s %11s %7s %9s %9s %7s\n' "$path -c $1 -m $2" "${e% *}" "${k% *}" \
			"$(awk -v a="${k% *}" -v b="${e% *}" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }')" \
			"${e#* }" "${k#* }" \
			"$(awk -v a="${k#* }" -v b="${e#* }" 'BEGIN { if (a > 0) printf "%.1fx", b / a; else print "-" }')"
	done
done
echo
echo "RSS after load: etcd $(rss $EPID) KiB, kvd $(rss $KPID) KiB (anon $(anon $KPID))"
