# What operators load into Prometheus and Grafana (contrib/), checked with
# the real tools against a running nginx with the module:
#
#   - `promtool check metrics` finds nothing to say about the status
#     location's Prometheus output (with per-location families in it);
#   - `promtool check rules` and `promtool test rules` on the alert rules
#     and their unit tests; every alert has a test that fires it, and its
#     runbook points at a section of docs/troubleshooting.md that exists;
#   - a real Prometheus (on 127.0.0.1, a free port, its own data directory)
#     scrapes the nginx, which has two named locations and one that names
#     none; then every expression of the dashboard and of the rules is
#     evaluated through Prometheus' HTTP API: each is valid and returns
#     series (an alert's expression without its threshold), so no panel or
#     alert names a metric or label value the module does not export; and
#     each location's label is there with its own counts;
#   - the dashboard is importable JSON with a Prometheus data source
#     variable that every panel and query uses.
#
# A plain Test::More file with its own redis-server, nginx and Prometheus
# on free ports, all stopped by pid; no fixed sleep: each wait is on an
# event (a port, a ready endpoint, a scrape, a rule evaluation), bounded.
# Skipped without prometheus/promtool (Debian's "prometheus" package,
# which scripts/setup.sh installs for the tests).  Run from the
# repository root.

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();
use HTTP::Tiny ();
use JSON::PP ();
use POSIX ();

use lib 't/lib';
use IdemTest ();
use Roads ();

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;
plan skip_all => 'prometheus and promtool are needed (apt-get install '
                 . 'prometheus; scripts/setup.sh test)'
    unless `sh -c 'command -v prometheus && command -v promtool'`
           =~ /promtool/;

my $Slow = $ENV{TEST_NGINX_USE_VALGRIND} ? 6 : 1;
my $Rules = 'contrib/prometheus/nginx-idempotency-alerts.yml';
my $RuleTests = 'contrib/prometheus/nginx-idempotency-alerts.test.yml';
my $Dashboard = 'contrib/grafana/nginx-idempotency-dashboard.json';

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t201-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my ($redis_pid, $prom_pid);
my $rport = IdemTest::free_port();
my $port = IdemTest::free_port();
my $pport = IdemTest::free_port();
my $http = HTTP::Tiny->new(timeout => 10 * $Slow);

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };
END { stop_all() }

$redis_pid = IdemTest::start_redis_on('127.0.0.1', $rport, $dir) or do {
    plan skip_all => "redis-server on 127.0.0.1:$rport did not start";
};


# --- the files alone -------------------------------------------------------

my $out = `promtool check rules $Rules 2>&1`;
is($?, 0, "promtool check rules $Rules") or diag($out);

$out = `cd contrib/prometheus && promtool test rules ${\ ($RuleTests =~ s{.*/}{}r)} 2>&1`;
is($?, 0, "promtool test rules $RuleTests") or diag($out);

my @rules = read_rules($Rules);
ok(@rules >= 8, 'alert rules found (' . scalar(@rules) . ')');

my $tests = slurp($RuleTests);
my $trouble = slurp('docs/troubleshooting.md');
my %anchors = map { anchor($_) => 1 } $trouble =~ /^#+ (.+)$/mg;

for my $r (@rules) {
    like($tests, qr/alertname: \Q$r->{alert}\E\n\s+exp_alerts:\n\s+- exp_labels/,
         "$r->{alert}: a unit test fires it");
    my ($a) = ($r->{runbook} // '') =~ m{^docs/troubleshooting\.md#(\S+)$};
    ok($a && $anchors{$a},
       "$r->{alert}: its runbook is a section of docs/troubleshooting.md")
        or diag("runbook: " . ($r->{runbook} // 'none'));
    ok(length($r->{summary} // ''), "$r->{alert}: has a summary");
}

my $dash = eval { JSON::PP->new->decode(slurp($Dashboard)) };
ok($dash, "$Dashboard is JSON") or diag($@);
$dash //= {};
ok(!exists $dash->{id} && $dash->{uid} && $dash->{title},
   'the dashboard is importable: a uid and a title, no database id');
my ($dsvar) = grep { $_->{type} eq 'datasource' }
              @{ $dash->{templating}{list} // [] };
is($dsvar && $dsvar->{query}, 'prometheus',
   'a data source variable of type prometheus');
my @panels = grep { $_->{type} ne 'row' } @{ $dash->{panels} // [] };
ok(@panels >= 12, 'panels found (' . scalar(@panels) . ')');
my %ids;
for my $p (@{ $dash->{panels} // [] }) {
    ok(!$ids{ $p->{id} }++, "panel \"$p->{title}\": an id of its own");
    ok($p->{gridPos}, "  with a place");
    next if $p->{type} eq 'row';
    is($p->{datasource}{uid}, '${' . $dsvar->{name} . '}',
       '  the data source variable');
    ok(@{ $p->{targets} // [] }, '  queries');
    is($_->{datasource}{uid}, '${' . $dsvar->{name} . '}',
       "  query $_->{refId} uses the data source variable")
        for @{ $p->{targets} // [] };
}
for my $title ('Outcomes by location', 'Replay ratio by location',
               'Conflicts and mismatches by location', 'Redis latency',
               'Connection health', 'Parked commands',
               'Cache hit ratio by location', 'Cache evictions and size')
{
    ok(scalar(grep { $_->{title} eq $title } @panels),
       "the dashboard has \"$title\"");
}


# --- nginx with two named locations ---------------------------------------

Roads::start_nginx($dir, $port, http_conf());

my $k = "t201-$$-" . time();
is(post('/pay', "$k-1", 'a'), 201, 'payments: MISS');
is(post('/pay', "$k-1", 'a'), 201, 'payments: HIT');
is(post('/pay', "$k-1", 'b'), 422, 'payments: MISMATCH');
is(post('/pay', "$k-2", 'a'), 201, 'payments: MISS');
is(post('/ord', "$k-3", 'a'), 201, 'orders: MISS');
is(post('/ord', undef, 'a'), 400, 'orders: MISSING');
is(get('/plain'), 201, 'default: BYPASS');

my $status = $http->get("http://127.0.0.1:$port/status?format=prometheus");
is($status->{status}, 200, 'the status location answers');
my $text = $status->{content} // '';
like($text, qr/^nginx_idempotency_location_requests_total\{location="payments",outcome="MISS"\} 2$/m,
     'payments counts its own');
like($text, qr/^nginx_idempotency_redis_maxmemory_policy\{pid="\d+",redis="[^"]+",connection="main",policy="noeviction"\} 1$/m,
     'the eviction policy of the Redis connection');

# promtool reads the exposition from its stdin
open my $fh, '>', "$dir/status.txt" or die $!;
print $fh $text;
close $fh;
$out = `promtool check metrics < $dir/status.txt 2>&1`;
is($?, 0, 'promtool check metrics: the status output passes');
is($out, '', '  and it has nothing to say about it');


# --- Prometheus scrapes it ------------------------------------------------

start_prometheus();

ok(wait_for(60, sub { my $r = $http->get("http://127.0.0.1:$pport/-/ready");
                      $r->{status} == 200 }),
   'Prometheus is ready');
# rate() needs two samples of the window: wait for three scrapes of nginx
ok(wait_for(60, sub {
       my $r = query('count_over_time(nginx_idempotency_info[5m])');
       $r && @$r && $r->[0]{value}[1] >= 3;
   }), 'Prometheus scraped the status location three times')
    or diag(`tail -20 $dir/prometheus.log`);

# up as of its last scrape (one scrape slowed down by a loaded machine
# may have missed its 1 s timeout: the next one counts)
ok(wait_for(30, sub {
       my $t = (api('/api/v1/targets') // {})->{activeTargets} // [];
       @$t == 1 && $t->[0]{health} eq 'up';
   }), 'the target is up');

# each location's label with its own counts
my %miss = map { $_->{metric}{location} => $_->{value}[1] }
    @{ query('nginx_idempotency_location_requests_total{outcome="MISS"}') // [] };
is_deeply(\%miss, { payments => 2, orders => 1, default => 0 },
          'MISS by location="NAME": each its own count');
my %hit = map { $_->{metric}{location} => $_->{value}[1] }
    @{ query('nginx_idempotency_location_requests_total{outcome=~"HIT|MISMATCH|MISSING|BYPASS"} > 0') // [] };
is(scalar(keys %hit), 3, 'payments, orders and default each have their other outcome');

# the dashboard's expressions, its variables filled in as Grafana would
# ("All": the regex .*; $__rate_interval: at least four scrape intervals)
my @exprs;
for my $p (@panels) {
    push @exprs, map { ["panel \"$p->{title}\" $_->{refId}", $_->{expr}] }
                 @{ $p->{targets} };
}
for my $v (grep { $_->{type} eq 'query' } @{ $dash->{templating}{list} }) {
    my $q = ref $v->{query} ? $v->{query}{query} : $v->{query};
    my ($metric, $label) = $q =~ /^label_values\((.+),\s*(\w+)\)$/
        or do { fail("variable $v->{name}: label_values(...)"); next };
    my $values = api('/api/v1/label/' . $label . '/values?match[]='
                     . uri(fill($metric))) // [];
    ok(@$values, "variable \$$v->{name}: $q has values (@$values)");
}
for my $e (@exprs) {
    my ($what, $expr) = @$e;
    my $r = query(fill($expr));
    ok($r && @$r, "$what returns series: $expr");
}

# every metric name and label value an expression asks for is one the
# status output has (a value among alternatives returns no series of its
# own to notice it by)
for my $e (@exprs, map { [$_->{alert}, $_->{expr}] } @rules) {
    my ($what, $expr) = @$e;
    for my $name ($expr =~ /\b(nginx_idempotency_\w+)/g) {
        ok($text =~ /^\Q$name\E[{ ]/m, "$what: $name is exported");
    }
    while ($expr =~ /\b(outcome|result|reason|location)=~?"([^"]*)"/g) {
        my ($label, $values) = ($1, $2);
        next if $values =~ /\$/;
        for my $v (split /\|/, $values) {
            ok($text =~ /[{,]\Q$label\E="\Q$v\E"/,
               "$what: $label=\"$v\" is exported");
        }
    }
}

# the rules' expressions: valid as they are, and their signal (the
# expression without the threshold) returns series
for my $r (@rules) {
    my $valid = query($r->{expr});
    ok(defined $valid, "$r->{alert}: the expression is valid");
    my ($signal) = $r->{expr} =~ /^(.*\))\s*>\s*[0-9.]+\s*$/s;
    ok($signal, "$r->{alert}: the expression is \"signal > threshold\"");
    my $s = $signal ? query($signal) : undef;
    ok($s && @$s, "$r->{alert}: its signal returns series");
}

# Prometheus loaded the rules and evaluated each of them without error
my @loaded;
ok(wait_for(30, sub {
       @loaded = map { @{ $_->{rules} } }
                 @{ (api('/api/v1/rules') // {})->{groups} // [] };
       @loaded == @rules
           && !grep { ($_->{lastEvaluation} // '') =~ /^0001-/ } @loaded;
   }), 'Prometheus loaded every rule and evaluated it');
for my $l (@loaded) {
    is($l->{health}, 'ok', "rule $l->{name}: health ok")
        or diag($l->{lastError});
}

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# --- helpers ----------------------------------------------------------------

sub slurp { Roads::slurp(@_) }

sub wait_for { Roads::wait_for(@_) }

# GitHub's anchor of a heading
sub anchor {
    my ($h) = @_;
    $h = lc $h;
    $h =~ s/[^a-z0-9 _-]//g;
    $h =~ s/ /-/g;
    return $h;
}

# the alerts of a rules file: name, expression, summary, runbook (the
# file's own layout: "- alert:", "expr: >-" and a folded block)
sub read_rules {
    my ($file) = @_;
    my @r;
    my $cur;
    my $block;
    for my $line (split /\n/, slurp($file)) {
        if ($line =~ /^\s*- alert: (\S+)$/) {
            push @r, $cur = { alert => $1 };
            undef $block;
            next;
        }
        next unless $cur;
        if ($line =~ /^(\s*)(expr|summary): >-$/) {
            $block = [$2, length $1];
            $cur->{$2} = '';
            next;
        }
        if ($block && $line =~ /^(\s*)(\S.*)$/ && length($1) > $block->[1]) {
            $cur->{ $block->[0] } .= ($cur->{ $block->[0] } eq '' ? '' : ' ')
                                     . $2;
            next;
        }
        undef $block;
        $cur->{runbook} = $1 if $line =~ /^\s*runbook: (\S+)$/;
    }
    return @r;
}

sub uri {
    my ($s) = @_;
    $s =~ s/([^A-Za-z0-9\-_.~])/sprintf('%%%02X', ord $1)/ge;
    return $s;
}

sub fill {
    my ($expr) = @_;
    $expr =~ s/\$__rate_interval/1m/g;
    $expr =~ s/\$(?:instance|location)\b/.*/g;
    return $expr;
}

# the data of a Prometheus API answer, undef for an error
sub api {
    my ($path) = @_;
    my $r = $http->get("http://127.0.0.1:$pport$path");
    my $j = eval { JSON::PP->new->decode($r->{content} // '') };
    return undef unless $j && ($j->{status} // '') eq 'success';
    return $j->{data};
}

# an instant query's result (an array of series), undef if it is invalid
sub query {
    my ($expr) = @_;
    my $d = api('/api/v1/query?query=' . uri($expr));
    return $d ? $d->{result} : undef;
}

sub request {
    my ($method, $uri, $key, $body) = @_;
    my $r = $http->request($method, "http://127.0.0.1:$port$uri", {
        headers => { defined $key ? ('Idempotency-Key' => $key) : () },
        defined $body ? (content => $body) : (),
    });
    return $r->{status};
}

sub post { return request('POST', @_) }
sub get { return request('GET', $_[0]) }

# the http{} of the node: two named locations and one that names none
sub http_conf {
    return <<HTTP;
    idempotency_scope "t201:";
    idempotency_redis 127.0.0.1:$rport prefix=t201-$$:;
    idempotency_cache_zone t201:1m;

    server {
        listen 127.0.0.1:$port;

        location = /status {
            idempotency_status;
            allow 127.0.0.1;
            deny all;
        }

        location = /pay {
            idempotency on;
            idempotency_metrics_label payments;
            idempotency_cache t201;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /ord {
            idempotency on;
            idempotency_required on;
            idempotency_metrics_label orders;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /plain {
            idempotency on;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /backend {
            return 201 "created\\n";
        }
    }
HTTP
}

sub start_prometheus {
    open my $fh, '>', "$dir/prometheus.yml" or die $!;
    print $fh <<CONF;
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - @{[ File::Spec->rel2abs($Rules) ]}
scrape_configs:
  - job_name: nginx-idempotency
    metrics_path: /status
    static_configs:
      - targets: ['127.0.0.1:$port']
CONF
    close $fh;

    $prom_pid = Roads::spawn(sub {
        open STDOUT, '>>', "$dir/prometheus.log";
        open STDERR, '>&', \*STDOUT;
        exec 'prometheus', "--config.file=$dir/prometheus.yml",
             "--storage.tsdb.path=$dir/prometheus-data",
             "--web.listen-address=127.0.0.1:$pport",
             '--log.level=warn'
            or POSIX::_exit(127);
    });
}

# Prometheus (TERM: QUIT would dump its goroutines), nginx, the Redis
sub stop_all {
    if ($prom_pid) {
        kill 'TERM', $prom_pid;
        Roads::wait_pid($prom_pid, 10);
        undef $prom_pid;
    }
    Roads::stop();
    if ($redis_pid) {
        kill 'TERM', $redis_pid;
        waitpid($redis_pid, 0);
        undef $redis_pid;
    }
}
