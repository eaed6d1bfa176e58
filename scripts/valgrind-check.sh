#!/bin/sh
# Fail when a valgrind log holds a report that valgrind.suppress does not
# cover. The runner (TEST_NGINX_VALGRIND_LOG) writes "=== t/x.t TEST n"
# before each nginx start, then valgrind's own lines.
#
#   scripts/valgrind-check.sh build/test/valgrind.log
set -eu

log=$1
[ -f "$log" ] || { echo "valgrind: no log at $log" >&2; exit 1; }
grep -q '^=== ' "$log" || { echo "valgrind: nginx never ran under valgrind" >&2; exit 1; }

errors='Invalid (read|write|free)|uninitialised|Mismatched free|definitely lost|indirectly lost|Syscall param|overlap|Jump to the invalid|Process terminating'
if ! grep -Eq "$errors" "$log"; then
    echo "valgrind: no errors ($(grep -c '^=== ' "$log") nginx runs, $log)"
    exit 0
fi

# Show each report with the test that produced it.
awk -v re="$errors" '
    /^=== / { test = $0; next }
    $0 ~ re { if (test != shown) { print test; shown = test } on = 1 }
    on      { print }
    /^==[0-9]+== *$/ { on = 0 }
' "$log" | head -n 400
echo "valgrind: errors above ($(grep -Ec "$errors" "$log") reports, full log: $log)" >&2
exit 1
