#!/usr/bin/env bash
# scripts/callgraph.sh: which src/*.c depends on which, and the circles.
#
#   scripts/callgraph.sh [-x NAME]... [DIR]
#
# For each DIR/*.c (DIR is src/ by default) it prints the edges to the other
# .c files, one a line, the files named without the ngx_http_idempotency_
# prefix and the .c (and the functions without the prefix):
#
#   body -> ctx  includes ngx_http_idempotency_ctx.h; calls get_ctx
#   body -> stats  includes ngx_http_idempotency_stats.h; calls key_hash
#
# "calls": the file names (calls, or takes the address of) a function that
# the other file defines without "static".  "includes": the file includes
# the other file's own header (X.h of X.c), itself or through a header it
# includes ("via" that one).  Then the cycles, first over calls only, then
# over calls and includes: for each set of files that reach each other,
# every cycle through them, shortest first (the first 40).
# -x NAME leaves a file out of the cycles (e.g. -x redis -x cluster
# -x sentinel); its edges are still listed.
#
# Comments, strings and preprocessor lines other than #define are not read.
# Needs only bash and perl.
set -eu

ignore=
while [ $# -gt 0 ]; do
    case $1 in
        -x) ignore="$ignore ${2:?-x needs a file name}"; shift 2 ;;
        -h|--help) sed -n '2,23s/^# \{0,1\}//p' "$0"; exit 0 ;;
        -*) echo "usage: $0 [-x NAME]... [DIR]" >&2; exit 2 ;;
        *) break ;;
    esac
done

dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/src}
[ -d "$dir" ] || { echo "$0: no directory $dir" >&2; exit 2; }

exec perl -e '
use strict;
use warnings;

my ($dir, $ignore) = @ARGV;
my %ignore = map { $_ => 1 } split " ", $ignore;
my $prefix = "ngx_http_idempotency_";

sub short {
    my ($s) = @_;
    $s =~ s{^.*/}{};
    $s =~ s{^\Q$prefix\E}{};
    $s =~ s{\.c$}{};
    return $s;
}

my (%code, %decl, %incs, %defs, %owner, %hincs);
my @files = sort glob("$dir/*.c");

# what each header includes, for the headers a .c file gets through others
for my $h (glob("$dir/*.h")) {
    open my $in, "<", $h or die "$h: $!\n";
    my $text = do { local $/; <$in> };
    close $in;
    (my $base = $h) =~ s{^.*/}{};
    $hincs{$base} = [ $text =~ /^[ \t]*#[ \t]*include[ \t]*"([^"]+)"/mg ];
}

for my $f (@files) {
    my $name = short($f);
    open my $in, "<", $f or die "$f: $!\n";
    my $text = do { local $/; <$in> };
    close $in;

    $incs{$name} = [ $text =~ /^[ \t]*#[ \t]*include[ \t]*"([^"]+)"/mg ];

    # comments and literals out, line breaks kept
    $text =~ s{ (/\*.*?\*/) | //[^\n]*
                | "(?:\\.|[^"\\\n])*" | \x27(?:\\.|[^\x27\\\n])*\x27 }
              { defined $1 ? "\n" x ($1 =~ tr/\n//) : "\"\"" }gsex;
    $text =~ s{\\\n}{ }g;

    # uses: all but #include and conditionals; definitions: no # at all
    ($code{$name} = $text) =~ s{^[ \t]*#[ \t]*(?!define\b)[^\n]*}{}mg;
    ($decl{$name} = $text) =~ s{^[ \t]*#[^\n]*}{}mg;
}

# non-static function definitions at file level: "name(...) {" there
for my $name (keys %decl) {
    my ($depth, $head) = (0, "");
    for my $c (split //, $decl{$name}) {
        if ($c eq "{") {
            if ($depth++ == 0
                && $head =~ /^(.*?)\b([A-Za-z_]\w*)
                             \s*\( (?:[^()]|\([^()]*\))* \)\s*$/sx
                && $1 !~ /=/)
            {
                my ($type, $fn) = ($1, $2);
                $defs{$name}{$fn} = 1;
                $owner{$fn} = $name if $type !~ /\bstatic\b/;
            }
            $head = "";
        } elsif ($c eq "}") {
            $depth-- if $depth > 0;
            $head = "" if $depth == 0;
        } elsif ($depth == 0) {
            $head = $c eq ";" ? "" : $head . $c;
        }
    }
}

my (%edge, %call, %inc);
my %files = map { $_ => 1 } keys %code;

for my $name (sort keys %code) {
    my %seen;
    for my $id ($code{$name} =~ /\b([A-Za-z_]\w*)\b/g) {
        my $to = $owner{$id};
        next if !defined $to || $to eq $name || $defs{$name}{$id}
                || $seen{$id}++;
        (my $s = $id) =~ s{^\Q$prefix\E}{};
        push @{ $call{$name}{$to} }, $s;
        $edge{call}{$name}{$to} = 1;
    }
    # the headers included, and those they include in turn ("via")
    my @todo = map { [ $_, "" ] } @{ $incs{$name} };
    my %got;
    while (my $next = shift @todo) {
        my ($h, $via) = @$next;
        next if $got{$h}++;
        push @todo, map { [ $_, $via || $h ] } @{ $hincs{$h} || [] };
        (my $to = $h) =~ s{\.h$}{};
        $to = short($to);
        next if $to eq $name || !$files{$to};
        $inc{$name}{$to} = $via ? "$h (via $via)" : $h;
    }
}

for my $from (sort keys %files) {
    my %to = (%{ $call{$from} || {} }, %{ $inc{$from} || {} });
    for my $to (sort keys %to) {
        my @why;
        push @why, "includes $inc{$from}{$to}" if $inc{$from}{$to};
        push @why, "calls " . join(" ", sort @{ $call{$from}{$to} })
            if $call{$from}{$to};
        print "$from -> $to  ", join("; ", @why), "\n";
    }
}

# Tarjan: the strongly connected components of more than one file
sub cycles {
    my ($g) = @_;
    my (%index, %low, %on, @stack, @sccs);
    my $i = 0;
    my $visit;
    $visit = sub {
        my ($v) = @_;
        $index{$v} = $low{$v} = $i++;
        push @stack, $v;
        $on{$v} = 1;
        for my $w (sort keys %{ $g->{$v} || {} }) {
            next if $ignore{$w};
            if (!defined $index{$w}) {
                $visit->($w);
                $low{$v} = $low{$w} if $low{$w} < $low{$v};
            } elsif ($on{$w} && $index{$w} < $low{$v}) {
                $low{$v} = $index{$w};
            }
        }
        if ($low{$v} == $index{$v}) {
            my @c;
            my $w;
            do { $w = pop @stack; $on{$w} = 0; push @c, $w } while $w ne $v;
            push @sccs, [ sort @c ] if @c > 1;
        }
    };
    for my $v (sort keys %files) {
        $visit->($v) if !$ignore{$v} && !defined $index{$v};
    }
    return @sccs;
}

my %both;
for my $kind (qw(call)) {
    for my $f (keys %{ $edge{$kind} }) {
        $both{$f}{$_} = 1 for keys %{ $edge{$kind}{$f} };
    }
}
for my $f (keys %inc) {
    $both{$f}{$_} = 1 for keys %{ $inc{$f} };
}


# the elementary cycles of a component, each once (from its least file)
sub circles {
    my ($g, $c) = @_;
    my %in = map { $_ => 1 } @$c;
    my @found;
    for my $s (@$c) {
        my @path = ($s);
        my %on = ($s => 1);
        my $walk;
        $walk = sub {
            my ($v) = @_;
            for my $w (sort keys %{ $g->{$v} || {} }) {
                next if !$in{$w} || $w lt $s;
                if ($w eq $s) {
                    push @found, [ @path ];
                } elsif (!$on{$w}) {
                    push @path, $w;
                    $on{$w} = 1;
                    $walk->($w);
                    $on{$w} = 0;
                    pop @path;
                }
            }
        };
        $walk->($s);
    }
    return sort { @$a <=> @$b || "@$a" cmp "@$b" } @found;
}

my $most = 40;

for my $run ([ "calls", $edge{call} ], [ "calls and includes", \%both ]) {
    my ($what, $g) = @$run;
    my @sccs = cycles($g);
    print "\ncycles over $what: ", @sccs ? "" : "none", "\n";
    for my $c (@sccs) {
        my @all = circles($g, $c);
        print "  among ", join(" ", @$c), ": ", scalar(@all),
              " cycle", @all == 1 ? "" : "s", ", shortest first\n";
        for my $i (0 .. $#all) {
            if ($i == $most) {
                print "    (", @all - $most, " more)\n";
                last;
            }
            print "    ", join(" -> ", @{ $all[$i] }, $all[$i][0]), "\n";
        }
    }
}
' "$dir" "$ignore"
