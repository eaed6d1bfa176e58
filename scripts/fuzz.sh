#!/usr/bin/env bash
# make fuzz: build the libFuzzer targets in fuzz/ with clang (ASan + UBSan)
# and run each for a bounded time; fails when a target finds a crash, an
# over-read or a broken property.
#
#   scripts/fuzz.sh [TARGET...]       default: key record reply
#   scripts/fuzz.sh --build-only [TARGET...]
#                                     build them, run nothing (make
#                                     check-src: a few seconds)
#
#   FUZZ_SECONDS=60    run time per target
#   FUZZ_RUNS=         a number of executions per target instead of a time
#   FUZZ_FLAGS=        more libFuzzer flags, e.g. -seed=1 or -dict=FILE
#
# Targets are built into build/fuzz/; each grows a working corpus in
# build/fuzz/corpus/TARGET, seeded from fuzz/corpus/TARGET (which is only
# read). A crash leaves its input in build/fuzz/artifacts/ and the command
# to reproduce it is printed.
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

seconds=${FUZZ_SECONDS:-60}
out=$BUILD/fuzz
cc=${FUZZ_CC:-clang}

command -v "$cc" > /dev/null \
    || die "$cc not found (scripts/setup.sh fuzz installs clang and libFuzzer)"

build_only=
if [ "${1:-}" = --build-only ]; then
    build_only=yes
    shift
fi

if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=(key record reply)
fi

# -I flags of the module build (nginx headers, src/, generated headers),
# made absolute: nginx's Makefile names them relative to its tree
module_incs() {
    [ -f "$BUILD/objs/Makefile" ] \
        || die "fuzz_$1 needs the configured module build: run make build"
    make -s --no-print-directory -C "$BUILD/nginx-src" -f "$BUILD/objs/Makefile" \
        --eval 'print-incs: ; @echo $(ALL_INCS)' print-incs \
        | sed "s|-I \([^/]\)|-I $BUILD/nginx-src/\1|g"
}

# what fuzz_TARGET.c is linked with: the pure C sources it exercises; the
# reply target compiles claim.c and handler.c into itself and stubs the
# rest of nginx and the module (fuzz_reply_stubs.c)
sources_of() {
    case $1 in
        key)    echo src/ngx_http_idempotency_key.c ;;
        record) echo src/ngx_http_idempotency_record.c ;;
        reply)  incs=$(module_incs "$1") || exit 1
                echo fuzz/fuzz_reply_stubs.c \
                     src/ngx_http_idempotency_key.c \
                     src/ngx_http_idempotency_record.c \
                     "$incs" -lhiredis -lcrypto ;;
        *)      die "unknown fuzz target '$1' (fuzz/fuzz_$1.c)" ;;
    esac
}

# inputs longer than this are not tried: a key is at most 255 bytes after
# decoding, a headers field is a few KB
max_len_of() {
    case $1 in
        key) echo 1024 ;;
        *)   echo 4096 ;;
    esac
}

mkdir -p "$out/artifacts"
flags=(-g -O1 -Wall -Wextra -Werror -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc)

for t in "${targets[@]}"; do
    [ -f "fuzz/fuzz_$t.c" ] || die "no fuzz/fuzz_$t.c"
    echo "fuzz: building $t"
    srcs=$(sources_of "$t")
    # shellcheck disable=SC2086 # several files and flags
    "$cc" "${flags[@]}" -o "$out/fuzz_$t" "fuzz/fuzz_$t.c" $srcs \
        || die "building fuzz_$t failed"
done

if [ -n "$build_only" ]; then
    echo "fuzz: built ${targets[*]} in ${out#"$ROOT"/}/ (not run)"
    exit 0
fi

failed=
for t in "${targets[@]}"; do
    mkdir -p "$out/corpus/$t"
    args=(-max_len="$(max_len_of "$t")" -print_final_stats=1
          -artifact_prefix="$out/artifacts/$t-")
    if [ -n "${FUZZ_RUNS:-}" ]; then
        args+=(-runs="$FUZZ_RUNS")
        what="$FUZZ_RUNS runs"
    else
        args+=(-max_total_time="$seconds")
        what="${seconds}s"
    fi
    [ -f "fuzz/$t.dict" ] && args+=(-dict="fuzz/$t.dict")
    log=$out/$t.log
    echo "fuzz: running $t for $what (log: $log)"
    # shellcheck disable=SC2086 # FUZZ_FLAGS: several flags
    if UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            "$out/fuzz_$t" "${args[@]}" ${FUZZ_FLAGS:-} \
            "$out/corpus/$t" "fuzz/corpus/$t" > "$log" 2>&1; then
        # "Done 123 runs in 60 second(s)" and the last coverage line
        runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log")
        cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[^ ]+' "$log" | tail -n 1)
        echo "fuzz: $t: ${runs:-?}, $cov, no crash"
    else
        failed="$failed $t"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz_.*property violated|.*runtime error)' \
            "$log" >&2 || tail -n 30 "$log" >&2
        crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "fuzz: $t FAILED; reproduce with: $out/fuzz_$t ${crash:-<input>}" >&2
    fi
done

[ -z "$failed" ] || die "crash or property violation in:$failed"
