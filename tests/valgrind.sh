#!/bin/sh
# valgrind.sh: end-to-end tests with residentd run under valgrind's memcheck
# (invalid accesses, uninitialised values, and definite or indirect leaks
# at exit are errors); fails if a test fails or valgrind reported anything.
#
#   tests/valgrind.sh BUILDDIR [TEST.py ...]   (default: test_faults.py test_budget.py)
#
# tests/run-all.sh runs it on the release build where valgrind is installed.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
shift
[ $# -gt 0 ] || set -- test_faults.py test_budget.py
if ! command -v valgrind >/dev/null 2>&1; then
	echo "valgrind.sh: SKIP: valgrind is not installed"
	exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/resident-vg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/residentd" <<WRAP
#!/bin/sh
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \\
	--show-leak-kinds=definite,indirect --suppressions="$top/tests/valgrind.supp" --log-file="$tmp/log.%p" \\
	"$build/residentd" "\$@"
WRAP
chmod +x "$tmp/residentd"
rc=0
for t in "$@"; do
	echo "== $t, residentd under valgrind"
	RESIDENT_DAEMON="$tmp/residentd" RESIDENT_INSTRUMENTED=valgrind RESIDENT_BUILDDIR="$build" \
	    RESIDENT_SRCDIR="$top" python3 "$top/tests/e2e/$t" > "$tmp/$t.out" 2>&1 || { rc=1; tail -n 30 "$tmp/$t.out"; }
	tail -n 1 "$tmp/$t.out"
done
for log in "$tmp"/log.*; do
	[ -s "$log" ] || continue
	echo "---- valgrind: $log"
	cat "$log"
	rc=1
done
[ $rc -eq 0 ] && echo "valgrind.sh: clean ($*)"
exit $rc
