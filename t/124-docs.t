# The documentation is checked against the code and against nginx:
# every directive of src/'s command tables has its entry in
# docs/directives.md (Syntax / Default / Context), every error-log message
# of src/ is in docs/troubleshooting.md, every $idempotency_status value is
# in docs/directives.md, so is every problem name src/ sends (and no other),
# every counter and JSON member of the status
# location is in docs/observability.md, every log line those pages quote is
# one that src/ writes, every nginx block in
# README.md and docs/*.md passes `nginx -t` with the built module, every
# relative link points at a file, no page refers to a file or text that
# users do not have, and every diagram's SVG is what its .dot source renders
# to.

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);
use JSON::PP ();
use Cwd qw(abs_path);

my $nginx  = $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx';
my $module = abs_path($ENV{TEST_NGINX_LOAD_MODULES}
                      || 'build/ngx_http_idempotency_module.so');

sub slurp {
    open my $h, '<', $_[0] or die "$_[0]: $!\n";
    local $/;
    return <$h>;
}

my @pages = ('README.md', sort glob('docs/*.md'));

# src/*.c by name (files come and go as the code is split)
my %src = map { $_ => slurp($_) } sort glob('src/*.c');

# -- directives: the command tables of src/*.c
my @directives;
for my $f (sort keys %src) {
    my $c = $src{$f};
    while ($c =~ /ngx_command_t\s+\w+\[\]\s*=\s*\{(.*?)ngx_null_command/sg) {
        my $table = $1;
        push @directives, $table =~ /\{\s*ngx_string\("(\w+)"\)/g;
    }
}
ok(scalar(grep { $_ eq 'idempotency_redis' } @directives),
   'found the command table (' . scalar(@directives) . ' directives)');
my $ref = slurp('docs/directives.md');
for my $d (@directives) {
    my ($entry) = $ref =~ /^### \Q$d\E\n(.*?)(?=^### |^---|\z)/ms;
    ok($entry, "docs/directives.md has an entry for $d");
    like($entry // '', qr/^\| Syntax:\s*\|\s*`\Q$d\E[ ;].*^\| Default:.*^\| Context:/ms,
         "  with Syntax, Default and Context, as nginx.org writes them");
}

# -- error-log messages: each ngx_log_error() of src/ is listed in
# docs/troubleshooting.md (its longest fixed text, prefixes and the
# formatted values left out)
my $trouble = slurp('docs/troubleshooting.md') =~ s/\s+/ /gr;
my $messages = 0;
for my $f (sort keys %src) {
    my $c = $src{$f};
    while ($c =~ /ngx_log_error\(\s*NGX_LOG_\w+\s*,[^,]+,[^,]+,\s*
                  ((?:"(?:[^"\\]|\\.)*"\s*)+)/gx)
    {
        my $fmt = join '', $1 =~ /"((?:[^"\\]|\\.)*)"/g;
        $fmt =~ s/\\"/"/g;
        $fmt =~ s/^idempotency(?: redis)?: //;
        my ($text) = sort { length $b <=> length $a }
            map { s/^[\s(),;:]+|[\s(),;:]+$//gr } split /%[*\w]+|"/, $fmt;
        next if length($text // '') < 8;
        $messages++;
        ok(index($trouble, $text) >= 0,
           "docs/troubleshooting.md lists \"$fmt\" ($f)");
    }
}
ok($messages >= 20, "error-log messages found in src/ ($messages)");

# -- $idempotency_status: every value the code has a name for is in the
# variable's row of docs/directives.md
my @outcomes;
for my $c (@src{sort keys %src}) {
    while ($c =~ /_outcome_names\[\]\s*=\s*\{(.*?)\};/sg) {
        push @outcomes, $1 =~ /ngx_string\("(\w+)"\)/g;
    }
}
ok(scalar(grep { $_ eq 'MISS' } @outcomes),
   'found the $idempotency_status values (' . scalar(@outcomes) . ')');
my ($varrow) = $ref =~ /^\| `\$idempotency_status` \|(.*)$/m;
ok($varrow, 'docs/directives.md has a row for $idempotency_status');
for my $o (@outcomes) {
    like($varrow // '', qr/`\Q$o\E`/, "  which lists $o");
}

# -- problem names: what idempotency_problem_type's entry in
# docs/directives.md lists is what src/ sends, no more and no less (the
# names of the problems table and of the admin location's problems)
my %problems;
for my $c (@src{sort keys %src}) {
    while ($c =~ /_problems\[\]\s*=\s*\{(.*?)\};/sg) {
        $problems{$_} = 1
            for $1 =~ /\{\s*NGX_\w+,\s*ngx_string\("([a-z-]+)"\)/g;
    }
    $problems{$_} = 1
        for $c =~ /_admin_problem\(\s*r,\s*\w+,\s*"([a-z-]+)"/g;
}
ok(keys %problems >= 10,
   'found the problem names src/ sends (' . scalar(keys %problems) . ')');
my ($ptype) = $ref =~ /^### idempotency_problem_type\n(.*?)(?=^### )/ms;
my %listed = map { $_ => 1 } ($ptype // '') =~ /`([a-z]+(?:-[a-z]+)+)`/g;
is_deeply([sort keys %listed], [sort keys %problems],
          'docs/directives.md: idempotency_problem_type lists every problem '
          . 'name src/ sends, no other');

# -- the status location: every Prometheus family and label value it
# writes is in docs/observability.md's table, and the JSON document there
# has every member the code writes, and no other
my $obs = slurp('docs/observability.md');
my (@families, @labels, %groups, %members);
for my $f (sort keys %src) {
    my $c = $src{$f};

    # the counters' table: family, label, JSON group and member
    while ($c =~ /ngx_http_idempotency_metric\(\s*"(\w+)",\s*
                  "((?:[^"\\]|\\.)*)",\s*"(\w+)",\s*"(\w+)"/gx)
    {
        my ($family, $label, $group, $field) = ($1, $2, $3, $4);
        push @families, $family;
        push @labels, [$family, $label =~ s/\\"/"/gr] if length $label;
        $groups{$group}{$field} = 1;
        $members{$group} = $members{$field} = 1;
    }

    # families written outside it, and the members of the JSON writers
    push @families,
        $c =~ /NGX_HTTP_IDEMPOTENCY_PREFIX\s*"(\w+?)(?:_bucket|_sum|_count)?[ {]/g,
        $c =~ /"(\w+)",\s*"(?:gauge|counter)",/g;
    while ($c =~ /^ngx_http_idempotency_status\w*_json\(.*?^\}/msg) {
        $members{$_} = 1 for $& =~ /\\"(\w+)\\":/g;
    }
}
my %family_seen;
@families = grep { !$family_seen{$_}++ } @families;
ok(@families >= 20, 'found the Prometheus families (' . scalar(@families) . ')');
for my $family (@families) {
    ok($obs =~ /`nginx_idempotency_\Q$family\E[`{ ]/,
       "docs/observability.md names nginx_idempotency_$family");
}
# a label's value is in its family's row or in the rows after it that
# shorten the name ("...{result=...}")
for my $l (@labels) {
    my ($family, $label) = @$l;
    my ($value) = $label =~ /="(.*)"$/;
    my ($rows) = $obs =~ /^(\|[ ]`nginx_idempotency_\Q$family\E[`{ ].*\n
                            (?:\|[ ]`\.\.\.\{.*\n)*)/mx;
    ok(defined $rows && $rows =~ /[`"]\Q$value\E[`"]/,
       "docs/observability.md: nginx_idempotency_$family has $label");
}

my ($example) = $obs =~ /^```json\n(.*?)^```$/ms;
my $json = eval { JSON::PP->new->decode($example // '') };
ok($json, 'docs/observability.md has the JSON document') or diag($@);
$json //= {};
for my $group (sort keys %groups) {
    is_deeply([sort keys %{ $json->{$group} // {} }],
              [sort keys %{ $groups{$group} }],
              "  its \"$group\" has the members the code writes");
}
my %in_example;
my $walk;
$walk = sub {
    my ($v, $parent) = @_;
    if (ref $v eq 'HASH') {
        for my $k (keys %$v) {
            # a bucket's bound and a location's label are values, not names
            $in_example{$k} = 1
                unless $k =~ /^(?:[\d.]+|\+Inf)$/
                       || ($parent // '') eq 'locations';
            $walk->($v->{$k}, $k);
        }
    } elsif (ref $v eq 'ARRAY') {
        $walk->($_) for @$v;
    }
};
$walk->($json);
ok(keys %members >= 40, 'found the JSON members (' . scalar(keys %members) . ')');
is_deeply([sort keys %in_example], [sort keys %members],
          '  the JSON document has every member the code writes, no other');

# -- log lines quoted in docs/troubleshooting.md and docs/observability.md:
# what is in backticks in the message column of a table of log lines (the
# table's head starts with "level"), and any backticked text that starts
# like the module's lines ("idempotency:", "idempotency redis:" ...).
# Placeholders stand for what the line fills in: <...>, ... and the
# capitals H N M E X ADDR REASON FILE NAME. Each piece between them is in
# a string literal of src/*.c, in which a conversion (%s, %V, %uz ...)
# stands for one word or for another literal of src/*.c (a reason, an
# outcome's name).

# the literals, comments left out; adjacent literals are one ("a" "b")
my @literals;
for my $c (@src{sort keys %src}) {
    my $run;
    while ($c =~ m{\G(?:("(?:[^"\\\n]|\\.)*")|(/\*.*?\*/|//[^\n]*|\s+)
                       |'(?:[^'\\]|\\.)*'|[^"'/\s]+|/)}gsx)
    {
        if (defined $1) {
            (my $text = substr $1, 1, -1) =~ s/\\(["\\])/$1/g;
            $run .= $text;
        } elsif (!defined $2 && defined $run) {
            push @literals, $run;
            undef $run;
        }
    }
}

my $placeholder = qr/<[^>]*>|\.\.\.|\b(?:H|N|M|E|X|ADDR|REASON|FILE|NAME)\b/;
my $conversion = qr/%0?\d*(?:\.\d+)?\*?[uxX]*[a-zA-Z]/;
my $value = do {
    my %v = map { $_ => 1 } grep { !/%/ && /\S/ } @literals;
    my $alt = join '|', map { quotemeta } sort { length $b <=> length $a } keys %v;
    qr/(?:$alt|\S*)/;
};

# any suffix or prefix of a text, the empty one included
sub suffix_re {
    my $re = '';
    $re = "(?:$re" . quotemeta($_) . ')?' for split //, $_[0];
    return $re;
}
sub prefix_re {
    my $re = '';
    $re = '(?:' . quotemeta($_) . "$re)?" for reverse split //, $_[0];
    return $re;
}

# a piece that runs from within fixed text i of a literal with conversions,
# over the conversions, to within its fixed text j
my @across = map {
    my $f = [ split /$conversion/, $_, -1 ];
    map {
        my $i = $_;
        map {
            my $j = $_;
            my $re = '^' . suffix_re($f->[$i]);
            $re .= $value . quotemeta($f->[$_]) for $i + 1 .. $j - 1;
            qr/$re$value@{[ prefix_re($f->[$j]) ]}$/;
        } $i + 1 .. $#$f;
    } 0 .. $#$f - 1;
} grep { /$conversion/ } @literals;

sub in_src {
    my ($piece) = @_;
    return (grep { index($_, $piece) >= 0 } @literals)
           || (grep { $piece =~ $_ } @across);
}

my $quoted = 0;
for my $page ('docs/troubleshooting.md', 'docs/observability.md') {
    my $col;
    for my $line (split /\n/, slurp($page)) {
        my @spans;
        if ($line =~ /^\|/) {
            my @cells = split /(?<!\\)\|/, $line;
            shift @cells;
            if ($line =~ /^\|\s*level\s*\|/) {
                ($col) = grep { $cells[$_] =~ /\b(?:message|lines)\b/ }
                         0 .. $#cells;
                next;
            }
            push @spans, $cells[$col] =~ /`([^`]+)`/g if defined $col;
        } else {
            undef $col;
        }
        push @spans, grep { /^idempotency[a-z ]*:/ } $line =~ /`([^`]+)`/g;

        # one word in the column ("store", "LOADING") is not a line
        my %span_seen;
        for my $span (grep { /\s/ && !$span_seen{$_}++ } @spans) {
            $quoted++;
            my @missing = grep { !in_src($_) }
                          grep { /[a-zA-Z]{3}/ }
                          map { s/^\s+|\s+$//gr } split /$placeholder/, $span;
            ok(!@missing, "$page quotes a log line of src/*.c: $span")
                or diag(map { "not in src/*.c: \"$_\"\n" } @missing);
        }
    }
}
ok($quoted >= 100, "log lines quoted in docs/troubleshooting.md and "
                   . "docs/observability.md ($quoted)");

# -- nginx blocks
my $tmp = tempdir(CLEANUP => 1);
# nginx -t opens its pid file: in logs/ for an nginx built without a
# --pid-path (make test NGINX_VERSION=...), unlike Debian's /run/nginx.pid
mkdir "$tmp/logs" or die "$tmp/logs: $!";
system("openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost "
       . "-days 2 -keyout $tmp/test.key -out $tmp/test.pem "
       . "> /dev/null 2>&1") == 0
    or BAIL_OUT('openssl could not make a test certificate');

# nginx -t on a configuration; an error message or undef
sub nginx_t {
    my ($conf) = @_;
    open my $h, '>', "$tmp/nginx.conf" or die $!;
    print $h $conf;
    close $h;
    my $out = `$nginx -q -t -e stderr -p $tmp/ -c $tmp/nginx.conf 2>&1`;
    return $? == 0 ? undef : $out;
}

# what a block needs around it: our module, test certificates instead of
# the placeholders, log files in the temporary prefix, a Redis when the
# block enables the module without naming one, and as much of
# main/http/server/location as the block leaves out
sub check_block {
    my ($text) = @_;
    my $loads = "load_module $module;\n";
    $text =~ s/^\s*load_module\s+[^;]+;\s*$//mg;
    $text =~ s/\b(ssl_certificate(?:_key)?)\s+\S+?\.(pem|key|crt);/"$1 $tmp\/test." . ($1 =~ m{_key} ? 'key' : 'pem') . ';'/ge;
    $text =~ s{\btls_(trusted_certificate|certificate)=\S+?\.(?:pem|crt)\b}
              {tls_$1=$tmp/test.pem}g;
    $text =~ s{\btls_certificate_key=\S+?\.key\b}
              {tls_certificate_key=$tmp/test.key}g;
    $text =~ s{\b(access_log|error_log)\s+/[^\s;]+}{$1 $tmp/log}g;
    my $redis = $text =~ /\bidempotency_redis\b/
        ? '' : "idempotency_redis 127.0.0.1:6379;\n";

    my @tries;
    if ($text =~ /^\s*http\s*\{/m) {
        my $events = $text =~ /^\s*events\s*\{/m ? '' : "events {}\n";
        @tries = ($loads . $events . $text);
    } elsif ($text =~ /^\s*server\s*\{/m) {
        @tries = ("${loads}events {}\nhttp {\n$redis$text\n}\n");
    } elsif ($text =~ /^\s*location\b/m) {
        @tries = ("${loads}events {}\nhttp {\n$redis"
                  . "server {\nlisten 127.0.0.1:8080;\n$text\n}\n}\n");
    } elsif ($text =~ /\S/) {
        # directives: whichever level takes them
        @tries = ("${loads}events {}\nhttp {\n$redis$text\n}\n",
                  "${loads}events {}\nhttp {\n$redis"
                  . "server {\nlisten 127.0.0.1:8080;\n$text\n}\n}\n",
                  "${loads}events {}\nhttp {\n$redis"
                  . "server {\nlisten 127.0.0.1:8080;\n"
                  . "location / {\n$text\n}\n}\n}\n");
    } else {
        @tries = ("${loads}events {}\n");
    }
    my $err;
    for my $conf (@tries) {
        $err = nginx_t($conf);
        return undef unless defined $err;
    }
    return $err;
}

my $blocks = 0;
for my $page (@pages) {
    my $md = slurp($page);
    my $n = 0;
    while ($md =~ /^```nginx\n(.*?)^```$/msg) {
        my $block = $1;
        $n++;
        $blocks++;
        my $err = check_block($block);
        ok(!defined $err, "$page: nginx block $n passes nginx -t")
            or diag("$err\n--- the block:\n$block");
    }
}
ok($blocks >= 8, "nginx blocks found in the pages ($blocks)");

my ($recipes) = scalar(() = slurp('docs/recipes.md') =~ /^```nginx$/mg);
is($recipes, 4, 'docs/recipes.md: a configuration for each of the 4 recipes');

# -- links between the pages (observability.md comes with the status
# counters' branch)
for my $page (@pages, 'CHANGELOG.md') {
    my $md = slurp($page);
    my $dir = $page =~ m{^(.*)/} ? $1 : '.';
    while ($md =~ /\]\(([^)#\s]+)(?:#[^)]*)?\)/g) {
        my $link = $1;
        next if $link =~ m{^[a-z]+:};
        next if $link =~ m{(^|/)observability\.md$};
        ok(-e "$dir/$link", "$page links to $link, which exists");
    }
}

# -- the pages stand on their own: no pointer to files or texts that ship
# only with the project's development (a design file, a sibling checkout,
# "the design", "the contract")
for my $page (@pages) {
    my $md = slurp($page);
    for my $bad (qr/DESIGN\.md/, qr{\.\./shared\b}, qr/\bthe design\b/i,
                 qr/\bcontract file\b/i, qr/\bthe contract\b/i,
                 qr/\bBehaviour \d+ of\b/i, qr/\bsteering repositor/i)
    {
        my @hits = $md =~ /^(.*$bad.*)$/mg;
        ok(!@hits, "$page does not refer to $bad")
            or diag(join "\n", @hits);
    }
}

# -- diagrams
my @dots = sort glob('docs/diagrams/*.dot');
ok(@dots >= 5, 'diagrams: four sequences and the phases');
for my $dot (@dots) {
    my $svg = $dot =~ s/\.dot$/.svg/r;
    ok(-f $svg, "$svg is committed next to $dot");
    (my $name = $svg) =~ s{^docs/}{};
    like(slurp('docs/how-it-works.md') . slurp('README.md'),
         qr/\Q$name\E/, "  and shown in docs/how-it-works.md");
}
SKIP: {
    skip 'Graphviz not installed (scripts/setup.sh docs)', 1
        unless system('command -v dot > /dev/null') == 0;
    is(system('scripts/docs.sh --check'), 0,
       'every SVG is what its .dot renders to (make docs)');
}

done_testing();
