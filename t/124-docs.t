# The documentation is checked against the code and against nginx:
# every directive of src/'s command tables has its entry in
# docs/directives.md (Syntax / Default / Context), every error-log message
# of src/ is in docs/troubleshooting.md, every nginx block in
# README.md and docs/*.md passes `nginx -t` with the built module, every
# relative link points at a file, no page refers to a file or text that
# users do not have, and every diagram's SVG is what its .dot source renders
# to.

use strict;
use warnings;

use Test::More;
use File::Temp qw(tempdir);
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

# -- directives: the command tables of src/*.c
my @directives;
for my $f (sort glob('src/*.c')) {
    my $c = slurp($f);
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
for my $f (sort glob('src/*.c')) {
    my $c = slurp($f);
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
