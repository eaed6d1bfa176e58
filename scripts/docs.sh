#!/bin/sh
# make docs: render every docs/diagrams/*.dot to the .svg next to it with
# Graphviz's dot. The SVGs are committed, so the pages show them without a
# build; t/124-docs.t checks they match their sources.
#
#   scripts/docs.sh [--check]    --check: render to a temporary file and
#                                fail if a committed SVG differs
set -eu
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

command -v dot > /dev/null || die "dot not found (scripts/setup.sh docs installs graphviz)"

check=
[ "${1:-}" = --check ] && check=yes
status=0
for src in docs/diagrams/*.dot; do
    svg=${src%.dot}.svg
    dot -Tsvg "$src" > "$svg.new" || die "dot failed on $src"
    if cmp -s "$svg.new" "$svg"; then
        rm "$svg.new"
    elif [ -n "$check" ]; then
        rm "$svg.new"
        echo "docs: $svg is not what $src renders to (make docs)" >&2
        status=1
    else
        mv "$svg.new" "$svg"
        echo "docs: rendered $svg"
    fi
done
exit $status
