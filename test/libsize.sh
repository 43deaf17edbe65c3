#!/bin/sh
# test/libsize.sh - the README's library sizes (Embedding): the text of
# libkvd.so built as a firmware tree would (-Os, sections, --gc-sections,
# kvd_* alone exported, as make lib does), with the network and without it
# (KVD_NO_NET), and without it and every optional part (recipes, auth, JWT,
# snapshots), for x86_64 and for mips in the MIPS16e ISA.  mbedtls and
# protobuf-c are not in these figures: they are shared libraries a router
# already has (OpenWrt ships both), linked, not counted.  Prints a table:
# `size`'s text (code and read-only data) and .text alone, in bytes.
set -eu
cd "$(dirname "$0")/.."
top=${KVD_CACHE:-/var/cache/kvd-test}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf 'KVD_0 {\n\tglobal: kvd_*;\n\tlocal: *;\n};\n' > "$out/map"
FLAGS="-Os -ffunction-sections -fdata-sections -fPIC -DKVD_NO_MAIN -DKVD_BUILD_LIB -fvisibility=hidden -w"
printf '| target | what | text (code + rodata) | .text |\n|---|---|---|---|\n'
for t in x86_64 mips16e; do
	case $t in
	x86_64) cc=${CC_X86_64:-cc} inc="" pfx="" ;;
	mips16e) cc=mips-linux-gnu-gcc pfx=mips-linux-gnu-
		inc="-mips16 -minterlink-compressed -I$top/mips-mips16-mbedtls3.6/include -idirafter /usr/include"
		if ! command -v $cc >/dev/null || [ ! -d "$top/mips-mips16-mbedtls3.6/include" ]; then
			echo "| mips16e | SKIPPED: needs mips-linux-gnu-gcc and make cross's mbedtls ($top) | | |"
			continue
		fi ;;
	esac
	for what in "everything" "no network" "no network, recipes, auth, JWT, snapshots"; do
		case $what in
		everything) knobs="" ;;
		"no network") knobs="-DKVD_NO_NET" ;;
		*) knobs="-DKVD_NO_NET -DKVD_NO_RECIPES -DKVD_NO_AUTH -DKVD_NO_JWT -DKVD_NO_SNAPSHOT" ;;
		esac
		# shellcheck disable=SC2086
		$cc $FLAGS $inc $knobs -c -o "$out/k.o" kvd.c
		# shellcheck disable=SC2086
		$cc $inc -shared -Wl,--gc-sections -Wl,--version-script="$out/map" -o "$out/k.so" "$out/k.o"
		text=$(${pfx}size "$out/k.so" | awk 'NR == 2 {print $1}')
		dottext=$(${pfx}size -A "$out/k.so" | awk '$1 == ".text" {print $2}')
		printf '| %s | %s | %s | %s |\n' $t "$what" "$text" "$dottext"
	done
done
