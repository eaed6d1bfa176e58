#!/usr/bin/env bash
# make lint: the style points of STYLE.md over src/ (80 columns, no tabs,
# no trailing space, no // comments), then cppcheck and clang-tidy
# (.clang-tidy); each must be clean. `make lint` installs both first.
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

status=0

# Style (STYLE.md): every file under src/, the C sources, headers and Lua
# scripts: at most 80 columns, no tabs, no trailing space; in C no '//'
# comments ('//' inside a string literal, such as a URL, is fine).
style=$(find src -type f \( -name '*.[ch]' -o -name '*.lua' \) | sort)
# shellcheck disable=SC2086 # one word per file
perl -e '
    my $bad = 0;
    for my $f (@ARGV) {
        open my $in, "<", $f or die "$f: $!\n";
        my $comment = 0;
        while (my $l = <$in>) {
            chomp $l;
            my @why;
            push @why, "longer than 80 columns" if length $l > 80;
            push @why, "tab" if $l =~ /\t/;
            push @why, "trailing space" if $l =~ /[ \t]$/;
            if ($f =~ /\.[ch]$/) {
                # what is left once strings, chars and comments are gone
                my $code = $l;
                $code =~ s{^.*?\*/}{} if $comment;
                $code = "" if $comment && $l !~ m{\*/};
                $code =~ s{"(?:\\.|[^"\\])*"|\x27(?:\\.|[^\x27\\])*\x27}{""}g;
                $code =~ s{/\*.*?\*/}{}g;
                $comment = ($code =~ s{/\*.*$}{}) ? 1
                           : ($comment && $l !~ m{\*/}) ? 1 : 0;
                push @why, "// comment" if $code =~ m{//};
            }
            for (@why) { print "$f:$.: $_\n"; $bad = 1 }
        }
    }
    exit $bad;
' $style || status=1
echo "lint: style done (80 columns, tabs, trailing space, // comments)"

# nginx's headers before any system header in every src/*.c
"$ROOT/scripts/build.sh" check-includes || status=1

if command -v cppcheck > /dev/null; then
    cppcheck --quiet --error-exitcode=1 --std=c99 \
        --enable=warning,performance,portability \
        --suppress=missingInclude --suppress=missingIncludeSystem \
        -I src src/*.c || status=1
    echo "lint: cppcheck done"
else
    echo "lint: cppcheck not installed (scripts/setup.sh lint)" >&2
    status=1
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
    echo "lint: clang-tidy not installed (scripts/setup.sh lint)" >&2
    status=1
fi

exit $status
