#!/usr/bin/env bash
# make lint: cppcheck and clang-tidy (.clang-tidy) over src/, where they are
# installed; each one that runs must be clean.
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

status=0

if command -v cppcheck > /dev/null; then
    cppcheck --quiet --error-exitcode=1 --std=c99 \
        --enable=warning,performance,portability \
        --suppress=missingInclude --suppress=missingIncludeSystem \
        -I src src/*.c || status=1
    echo "lint: cppcheck done"
else
    echo "lint: cppcheck not installed, skipped"
fi

if command -v clang-tidy > /dev/null; then
    # the include flags of the module build, made absolute
    incs=$(make -s --no-print-directory -C "$BUILD/nginx-src" \
               -f "$BUILD/objs/Makefile" \
               --eval 'print-incs: ; @echo $(ALL_INCS)' print-incs \
           | sed "s|-I \([^/]\)|-I $BUILD/nginx-src/\1|g")
    for f in src/*.c; do
        # shellcheck disable=SC2086
        clang-tidy --quiet "$f" -- -D_GNU_SOURCE $incs 2> /dev/null \
            || status=1
    done
    echo "lint: clang-tidy done"
else
    echo "lint: clang-tidy not installed, skipped"
fi

exit $status
