# Observability: the idempotency_status location (JSON and the Prometheus
# text format), the counters in shared memory (one set for all workers), and
# error-log lines that name a record by key_hash= only.
#
# nginx runs with a master and two workers (under valgrind: one process).
# The counters start at zero with each fresh nginx; blocks without
# "--- config" reuse the nginx of the block before and see its counts.
# Requests that must be counted are sent from "--- init" by http() below,
# which reads each response to its end: a request is counted when it is
# logged, and nginx closes a "Connection: close" connection after that.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use IO::Socket::INET ();
use JSON::PP ();

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t110-$$-" . time() . ":";

our $Rate = int(80 / $Slow);
$ENV{TEST_NGINX_RATE} = $Rate;

# the one place the version is written
our $Version = do {
    open my $fh, '<', 'src/ngx_http_idempotency_version.h'
        or die "src/ngx_http_idempotency_version.h: $!";
    local $/;
    <$fh> =~ /NGX_HTTP_IDEMPOTENCY_VERSION\s+"([^"]+)"/ or die "no version";
    $1;
};

our @Outcomes = qw(BYPASS MISS HIT CONFLICT MISMATCH MISSING INVALID
                   OVERSIZE ERROR UNSCOPED UNKNOWN);

our $HttpConfig = qq{
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
    location = /status {
        idempotency_status;
    }

    location = /t {
        idempotency on;
        add_header X-Pid $pid always;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /required {
        idempotency on;
        idempotency_required on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /slow {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-backend;
    }

    location = /fail {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/fail-backend;
    }

    location = /small {
        idempotency on;
        idempotency_max_response_size 4;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /ep {
        idempotency on;
        proxy_pass http://127.0.0.1:1/;
        error_page 502 = @fallback;
    }

    location @fallback {
        return 200 "fallback\n";
    }

    location = /backend {
        return 201 "created\n";
    }

    location = /fail-backend {
        return 503 "try later\n";
    }

    # about 2 s for the response (limit_rate counts the header too)
    location = /slow-backend {
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
};

# Redis failures: a small command timeout, so that a paused Redis is
# noticed quickly; a claim renewed every 200 ms; a claim that outlives the
# slow upstream (about 2 s) by 1 s.
our $Timeout = 300 * $Slow;
$ENV{TEST_NGINX_LOCK_SHORT} = (600 * $Slow) . 'ms';
$ENV{TEST_NGINX_LOCK_LONG} = (3000 * $Slow) . 'ms';

our $FailHttpConfig = qq{
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX}
                      timeout=${Timeout}ms connect_timeout=${Timeout}ms;
};

our $FailConfig = q{
    location = /status {
        idempotency_status;
    }

    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /fence {
        idempotency on;
        idempotency_lock_ttl $TEST_NGINX_LOCK_SHORT;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-backend;
    }

    location = /park {
        idempotency on;
        idempotency_lock_ttl $TEST_NGINX_LOCK_LONG;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/slow-backend;
    }

    location = /backend {
        return 201 "created\n";
    }

    location = /slow-backend {
        limit_rate $TEST_NGINX_RATE;
        return 201 "slow done\n";
    }
};

# Per-location counters: two named locations, one that names none (the
# default name), a label inherited by a nested location, a cache.
our $LabelConfig = q{
    location = /status {
        idempotency_status;
    }

    location = /pay {
        idempotency on;
        idempotency_metrics_label payments;
        idempotency_cache t110;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /ord {
        idempotency on;
        idempotency_required on;
        idempotency_metrics_label orders;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /plain {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location /nested/ {
        idempotency_metrics_label api/v2:nested;

        location = /nested/in {
            idempotency on;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
        }
    }

    location = /backend {
        return 201 "created\n";
    }
};

our $LabelHttpConfig = $HttpConfig . q{
    idempotency_cache_zone t110:1m;
};

# The per-location counters of a JSON status and of the Prometheus output:
# { NAME => { "group.field" => value } } each.
sub locations_json {
    my ($s) = @_;
    my %l;
    for my $name (keys %{ $s->{locations} // {} }) {
        my $f = flat($s->{locations}{$name});
        $l{$name} = $f;
    }
    return \%l;
}

sub locations_prometheus {
    my ($fam) = @_;
    my %l;
    my %group = (requests => 'outcome', responses => 'result');
    for my $g (keys %group) {
        for my $s (@{ $fam->{"nginx_idempotency_location_${g}_total"}{samples} // [] }) {
            $l{ $s->[1]{location} }{"$g.$s->[1]{$group{$g}}"} = $s->[2];
        }
    }
    for my $c (qw(hits misses)) {
        for my $s (@{ $fam->{"nginx_idempotency_location_cache_${c}_total"}{samples} // [] }) {
            $l{ $s->[1]{location} }{"cache.$c"} = $s->[2];
        }
    }
    return \%l;
}

# One request on its own connection, read to the end: (status, head, body).
sub http {
    my ($method, $uri, $headers, $body) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 10,
    ) or die "connect: $!";
    my $req = "$method $uri HTTP/1.1\r\nHost: localhost\r\n"
              . "Connection: close\r\n";
    $req .= "$_\r\n" for @{ $headers // [] };
    $req .= 'Content-Length: ' . length($body) . "\r\n" if defined $body;
    print $sock $req, "\r\n", $body // '';
    local $/;
    my $resp = <$sock> // '';
    close $sock;
    my ($head, $content) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.[01] (\d{3})};
    return ($status // 0, $head // '', $content // '');
}

sub post {
    my ($uri, $key, $body) = @_;
    my ($status) = http('POST', $uri,
                        defined $key ? ["Idempotency-Key: $key"] : [],
                        $body // 'x');
    return $status;
}

sub status_json {
    my ($status, $head, $body) = http('GET', '/status?format=json');
    die "status: $status\n" unless $status == 200;
    return JSON::PP::decode_json($body);
}

sub status_prometheus {
    my ($status, $head, $body) = http('GET', '/status?format=prometheus');
    die "status: $status\n" unless $status == 200;
    return $body;
}

# Every counter of a JSON status as "group.field" => value (the histograms
# as redis_latency_ms.count and redis_wait_ms.count only, the locations' as
# "locations.NAME.group.field").
sub flat {
    my ($s) = @_;
    my %f;
    for my $g (keys %$s) {
        next unless ref $s->{$g} eq 'HASH';
        if ($g eq 'locations') {
            for my $l (keys %{ $s->{$g} }) {
                my $f = flat($s->{$g}{$l});
                $f{"$g.$l.$_"} = $f->{$_} for keys %$f;
            }
            next;
        }
        if ($g eq 'redis_latency_ms' || $g eq 'redis_wait_ms') {
            $f{"$g.count"} = $s->{$g}{count};
            next;
        }
        $f{"$g.$_"} = $s->{$g}{$_} for keys %{ $s->{$g} };
    }
    return \%f;
}

# A strict reader of the Prometheus text exposition format 0.0.4: every
# line is a HELP, a TYPE or a sample; a family's HELP and TYPE come once,
# before its samples, and its samples are together; counters end in
# _total; a histogram has _bucket lines with ascending "le", cumulative
# counts, a last bucket "+Inf" equal to _count, and _sum.  Returns a hash
# of family => { type, help, samples => [[name, {labels}, value]] }, or
# dies with the offending line.
sub parse_prometheus {
    my ($text) = @_;
    die "does not end with a newline\n" unless $text =~ /\n\z/;
    my $name_re = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
    my $value_re = qr/[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?
                      |[-+]?Inf|NaN/x;
    my (%fam, @order, $current);
    my $family_of = sub {
        my ($n) = @_;
        return $n if $fam{$n};
        (my $base = $n) =~ s/_(?:bucket|sum|count)\z//;
        return $base if $fam{$base} && $fam{$base}{type} eq 'histogram';
        return undef;
    };
    for my $line (split /\n/, $text) {
        if ($line =~ /^# HELP ($name_re) (.*)$/) {
            die "HELP twice: $line\n" if $fam{$1}{help};
            die "HELP after samples: $line\n" if $fam{$1}{samples};
            $fam{$1}{help} = $2;
            push @order, $1 unless grep { $_ eq $1 } @order;
            next;
        }
        if ($line =~ /^# TYPE ($name_re) (counter|gauge|histogram|summary|untyped)$/) {
            die "TYPE twice: $line\n" if $fam{$1}{type};
            die "TYPE after samples: $line\n" if $fam{$1}{samples};
            $fam{$1}{type} = $2;
            push @order, $1 unless grep { $_ eq $1 } @order;
            next;
        }
        die "not a sample: $line\n"
            unless $line =~ /^($name_re)(?:\{(.*)\})? ($value_re)(?: -?[0-9]+)?$/;
        my ($n, $labels, $v) = ($1, $2, $3);
        my %l;
        if (defined $labels) {
            my $rest = $labels;
            while (length $rest) {
                $rest =~ s/^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|\z)//
                    or die "bad labels: $line\n";
                die "label twice: $line\n" if exists $l{$1};
                $l{$1} = $2;
            }
        }
        my $f = $family_of->($n) // die "no HELP/TYPE for: $line\n";
        die "no HELP for: $line\n" unless defined $fam{$f}{help};
        die "no TYPE for: $line\n" unless $fam{$f}{type};
        die "samples of $f are not together\n"
            if defined $current && $current ne $f && $fam{$f}{samples};
        $current = $f;
        push @{ $fam{$f}{samples} }, [$n, \%l, $v];
    }
    for my $f (@order) {
        my $F = $fam{$f};
        die "$f: no samples\n" unless $F->{samples};
        die "$f: not prefixed\n" unless $f =~ /^nginx_idempotency_/;
        if ($F->{type} eq 'counter') {
            die "$f: a counter without _total\n" unless $f =~ /_total\z/;
            for my $s (@{ $F->{samples} }) {
                die "$f: negative or fractional\n" unless $s->[2] =~ /^[0-9]+$/;
            }
        }
        next unless $F->{type} eq 'histogram';
        my @b = grep { $_->[0] eq "${f}_bucket" } @{ $F->{samples} };
        my ($sum) = grep { $_->[0] eq "${f}_sum" } @{ $F->{samples} };
        my ($count) = grep { $_->[0] eq "${f}_count" } @{ $F->{samples} };
        die "$f: no buckets, _sum or _count\n" unless @b && $sum && $count;
        my ($le, $n) = (-1, 0);
        for my $b (@b) {
            my $bl = $b->[1]{le} // die "$f: bucket without le\n";
            my $x = $bl eq '+Inf' ? 9**9**9 : $bl;
            die "$f: le not ascending at $bl\n" unless $x > $le;
            die "$f: buckets not cumulative at $bl\n" unless $b->[2] >= $n;
            ($le, $n) = ($x, $b->[2]);
        }
        die "$f: last bucket is not +Inf\n" unless $b[-1][1]{le} eq '+Inf';
        die "$f: +Inf != _count\n" unless $b[-1][2] == $count->[2];
    }
    return \%fam;
}

workers(2);
master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: JSON by default, with the version and no caching headers
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
GET /status
--- error_code: 200
--- response_headers
Content-Type: application/json
Cache-Control: no-store
!Last-Modified
!ETag
!Expires
--- response_body_like eval
qr/\A\{\n  "version": "\Q$::Version\E",\n  "requests": \{"BYPASS": 0, "MISS": 0, /



=== TEST 2: the JSON parses, has every group and counter, and all are 0 on a fresh nginx
--- init
my $s = main::status_json();
Test::More::is($s->{version}, $main::Version, 'version');
Test::More::is_deeply([sort keys %{ $s->{requests} }], [sort @main::Outcomes],
                      'one counter per $idempotency_status value');
Test::More::is_deeply([sort keys %{ $s->{responses} }],
                      [qw(error_page incomplete not_run not_storable stored
                          too_large upstream_error)],
                      'responses by result');
Test::More::is_deeply([sort keys %{ $s->{store_failures} }],
                      [qw(claim_lost given_up redis_error)], 'store failures');
Test::More::is_deeply([sort keys %{ $s->{release_failures} }],
                      [qw(given_up redis_error)], 'release failures');
Test::More::is_deeply([sort keys %{ $s->{redis} }],
                      [qw(commands connection_errors error_replies given_up
                          parked reconnects replies timeouts waited waits)],
                      'redis');
Test::More::is_deeply([sort keys %{ $s->{redis_wait_short} }],
                      [qw(claim_refused store_resent)],
                      'writes short of acknowledgements');
Test::More::is_deeply([sort keys %{ $s->{redis_latency_ms}{buckets} }],
                      [sort qw(0.5 1 2.5 5 10 25 50 100 250 500 1000 +Inf)],
                      'latency buckets');
my $f = main::flat($s);
Test::More::is_deeply([grep { $f->{$_} != 0 } sort keys %$f], [],
                      'every counter is 0');
--- request
GET /status?format=json
--- error_code: 200
--- response_headers
Content-Type: application/json



=== TEST 3: Accept: text/plain gives the Prometheus text format
--- request
GET /status
--- more_headers
Accept: text/plain
--- error_code: 200
--- response_headers
Content-Type: text/plain; version=0.0.4
--- response_body_like eval
qr/^# TYPE nginx_idempotency_requests_total counter\nnginx_idempotency_requests_total\{outcome="BYPASS"\} 0\n/m



=== TEST 4: Prometheus's own Accept header (OpenMetrics first) gives the Prometheus text format
--- request
GET /status
--- more_headers
Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1
--- error_code: 200
--- response_headers
Content-Type: text/plain; version=0.0.4



=== TEST 5: JSON preferred by q over text/plain gives JSON; a browser's Accept gives JSON
--- request eval
["GET /status", "GET /status"]
--- more_headers eval
["Accept: text/plain;q=0.4, application/json",
 "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"]
--- error_code eval
[200, 200]
--- response_headers eval
["Content-Type: application/json", "Content-Type: application/json"]



=== TEST 6: ?format= wins over Accept
--- request eval
["GET /status?format=prometheus", "GET /status?format=json"]
--- more_headers eval
["Accept: application/json", "Accept: text/plain"]
--- error_code eval
[200, 200]
--- response_headers eval
["Content-Type: text/plain; version=0.0.4", "Content-Type: application/json"]



=== TEST 7: an unknown format is a 400
--- request
GET /status?format=xml
--- error_code: 400
--- error_log
idempotency status: unknown format "xml"



=== TEST 8: POST is refused with 405 and Allow
--- request
POST /status
x
--- error_code: 405
--- response_headers
Allow: GET, HEAD



=== TEST 9: HEAD has the headers and no body
--- request
HEAD /status?format=prometheus
--- error_code: 200
--- response_headers
Content-Type: text/plain; version=0.0.4
--- response_body



=== TEST 10: every outcome is counted exactly, and what became of each response
# MISS, HIT, MISMATCH, INVALID, MISSING, two BYPASS (no key; GET), a
# CONFLICT against a running first request, responses not stored (status),
# released (error_page), too large (then OVERSIZE), client gone (the
# response is still read to its end and stored),
# and ERROR with Redis killed.
--- skip_eval: 22: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
my $S = $main::Slow;
my %want;
Test::More::is(main::post('/t', 'o-miss', 'a'), 201, 'MISS');
# the store goes to Redis from one worker, the retry may come to the other
select(undef, undef, undef, 0.1 * $S);
Test::More::is(main::post('/t', 'o-miss', 'a'), 201, 'HIT');
Test::More::is(main::post('/t', 'o-miss', 'b'), 422, 'MISMATCH');
Test::More::is(main::post('/t', '"unterminated', 'a'), 400, 'INVALID');
Test::More::is(main::post('/required', undef, 'a'), 400, 'MISSING');
Test::More::is(main::post('/t', undef, 'a'), 201, 'BYPASS without a key');
Test::More::is((main::http('GET', '/t'))[0], 201, 'BYPASS for a GET');
main::first_request('/slow', 'o-busy');
Test::More::is(main::post('/slow', 'o-busy'), 409, 'CONFLICT');
Test::More::is(main::post('/fail', 'o-fail'), 503, 'MISS, not storable');
Test::More::is(main::post('/ep', 'o-ep'), 200, 'MISS, error_page');
Test::More::is(main::post('/small', 'o-big'), 201, 'MISS, too large');
select(undef, undef, undef, 0.1 * $S);
Test::More::is(main::post('/small', 'o-big'), 422, 'OVERSIZE');
main::first_request('/slow', 'o-gone', 0.2, 3.5);
main::redis_ctl('kill');
select(undef, undef, undef, 0.3 * $S);
Test::More::is(main::post('/t', 'o-down'), 503, 'ERROR');
main::redis_ctl('start');
select(undef, undef, undef, 2.5 * $S);

my $s = main::status_json();
Test::More::is_deeply($s->{requests},
    { BYPASS => 2, MISS => 6, HIT => 1, CONFLICT => 1, MISMATCH => 1,
      MISSING => 1, INVALID => 1, OVERSIZE => 1, ERROR => 1, UNSCOPED => 0,
      UNKNOWN => 0 },
    'requests by outcome')
    or Test::More::diag(JSON::PP->new->canonical->encode($s->{requests}));
Test::More::is_deeply($s->{responses},
    { stored => 3, too_large => 1, not_storable => 1, error_page => 1,
      incomplete => 0, not_run => 0, upstream_error => 0 },
    'responses by result')
    or Test::More::diag(JSON::PP->new->canonical->encode($s->{responses}));
my $r = $s->{redis};
Test::More::cmp_ok($r->{commands}, '>=', 10, 'Redis commands sent');
Test::More::cmp_ok($r->{replies}, '<=', $r->{commands}, 'replies <= commands');
Test::More::is($s->{redis_latency_ms}{count}, $r->{replies},
               'one round trip per reply');
Test::More::cmp_ok($r->{connection_errors}, '>=', 1, 'connection lost');
Test::More::cmp_ok($r->{reconnects}, '>=', 1, 'reconnected');
Test::More::is($r->{error_replies}, 0, 'no error replies');
--- request
GET /status
--- error_code: 200



=== TEST 11: every claimed request's response has exactly one result
--- skip_eval: 2: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
my $s = main::status_json();
Test::More::is($s->{responses}{stored} + $s->{responses}{too_large}
               + $s->{responses}{not_storable}
               + $s->{responses}{error_page} + $s->{responses}{incomplete}
               + $s->{responses}{not_run} + $s->{responses}{upstream_error},
               $s->{requests}{MISS}, 'one result per MISS');
--- request
GET /status
--- error_code: 200



=== TEST 12: the Prometheus output passes a strict exposition-format reader, with the same counts as JSON
--- init
my $json = main::status_json();
my $text = main::status_prometheus();
my $fam = eval { main::parse_prometheus($text) };
Test::More::ok($fam, 'the exposition format is valid') or Test::More::diag($@);
$fam //= {};
Test::More::is_deeply([ map { [$_->[1]{version}, $_->[2]] }
                        @{ $fam->{nginx_idempotency_info}{samples} // [] } ],
                      [[$main::Version, 1]], 'nginx_idempotency_info');
Test::More::is($fam->{nginx_idempotency_info}{type}, 'gauge', 'info is a gauge');
my %req = map { $_->[1]{outcome} => $_->[2] }
          @{ $fam->{nginx_idempotency_requests_total}{samples} // [] };
Test::More::is_deeply(\%req, $json->{requests}, 'requests as in JSON');
my %resp = map { $_->[1]{result} => $_->[2] }
           @{ $fam->{nginx_idempotency_responses_total}{samples} // [] };
Test::More::is_deeply(\%resp, $json->{responses}, 'responses as in JSON');
my $h = $fam->{nginx_idempotency_redis_latency_seconds} // {};
Test::More::is($h->{type}, 'histogram', 'latency is a histogram');
my @le = map { $_->[1]{le} } grep { $_->[0] =~ /_bucket$/ } @{ $h->{samples} // [] };
Test::More::is_deeply(\@le, [qw(0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1
                                0.25 0.5 1 +Inf)], 'bucket bounds in seconds');
my ($count) = map { $_->[2] } grep { $_->[0] =~ /_count$/ } @{ $h->{samples} // [] };
if ($ENV{TEST_NGINX_REDIS_CTL}) {
    Test::More::cmp_ok($count, '>', 0, 'round trips were measured');
} else {    # TEST 10, whose requests make them, was skipped
    Test::More::ok(defined $count, 'round trips are counted');
}
Test::More::is($count, $json->{redis}{replies}, 'one per reply, as in JSON');
my $doc = do { local (@ARGV, $/) = 'docs/observability.md'; <> };
Test::More::is_deeply([ grep { index($doc, "`$_") < 0 } sort keys %$fam ], [],
                      'every metric is in docs/observability.md');
--- request
GET /status?format=prometheus
--- error_code: 200



=== TEST 13: the reader refuses what the format forbids
--- init
for my $bad ("# HELP nginx_idempotency_x_total x\nnginx_idempotency_x_total 1\n",
             "# HELP nginx_idempotency_x_total x\n# TYPE nginx_idempotency_x_total counter\nnginx_idempotency_x_total{a=\"1\"} one\n",
             "# HELP nginx_idempotency_h x\n# TYPE nginx_idempotency_h histogram\n"
             . "nginx_idempotency_h_bucket{le=\"1\"} 2\nnginx_idempotency_h_bucket{le=\"+Inf\"} 1\n"
             . "nginx_idempotency_h_sum 0\nnginx_idempotency_h_count 1\n",
             "# HELP nginx_idempotency_h x\n# TYPE nginx_idempotency_h histogram\n"
             . "nginx_idempotency_h_bucket{le=\"1\"} 1\nnginx_idempotency_h_bucket{le=\"+Inf\"} 1\n"
             . "nginx_idempotency_h_sum 0\nnginx_idempotency_h_count 2\n",
             "# HELP nginx_idempotency_x x\n# TYPE nginx_idempotency_x counter\nnginx_idempotency_x 1\n")
{
    Test::More::ok(!eval { main::parse_prometheus($bad); 1 },
                   "refused: " . ($@ =~ s/\n//r));
}
--- request
GET /status
--- error_code: 200



=== TEST 14: the counters are shared: requests served by both workers add up
# BYPASS requests (a GET needs no Redis) until both workers served some,
# then the total equals the number sent.  They go to a server of their own
# with "reuseport": each worker has its own socket and the kernel spreads
# new connections over them (on one shared socket, one worker may accept
# all of them on a quiet machine).
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- http_config eval
$::HttpConfig . q{
    server {
        listen 127.0.0.1:$TEST_NGINX_RAND_PORT_1 reuseport;

        location = /t {
            idempotency on;
            add_header X-Pid $pid always;
            proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
        }
    }
}
--- config eval: $::Config
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $conf = do { local (@ARGV, $/) = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf"; <> };
$conf =~ /listen\s+127\.0\.0\.1:(\d+)\s+reuseport/ or die "no reuseport server\n";
my $spread = $1;
my (%pids, $sent);
for my $n (1 .. 200) {
    local $ENV{TEST_NGINX_SERVER_PORT} = $spread;
    my ($status, $head) = main::http('GET', '/t');
    $head =~ /^X-Pid: (\d+)/mi and $pids{$1}++;
    $sent = $n;
    last if $n >= 20 && keys %pids >= 2;
}
Test::More::cmp_ok(scalar keys %pids, '>=', 2, "both workers served ($sent requests)");
Test::More::is(main::status_json()->{requests}{BYPASS}, $sent,
               'the status (from either worker) counts them all');
--- request
GET /status
--- error_code: 200



=== TEST 15: the counters go on across a reload
--- skip_eval: 3: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $before = main::status_json()->{requests}{BYPASS};
open my $fh, '<', "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid" or die $!;
chomp(my $pid = <$fh>);
kill 'HUP', $pid or die "cannot HUP $pid";
select(undef, undef, undef, 1.5 * $main::Slow);
main::http('GET', '/t');
Test::More::cmp_ok($before, '>', 0, 'counted before');
Test::More::is(main::status_json()->{requests}{BYPASS}, $before + 1,
               'kept after the reload');
--- request
GET /status
--- error_code: 200



=== TEST 16: a status location alone (no "idempotency on" anywhere) works
--- config
    location = /status {
        idempotency_status;
    }
--- request
GET /status
--- error_code: 200
--- response_body_like chomp
"requests": \{"BYPASS": 0,



=== TEST 17: at info level a MISMATCH is logged with the key's hash, never the key
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- log_level: info
--- init
main::post('/t', 'secret-key-17', 'a');
--- request
POST /t
b
--- more_headers
Idempotency-Key: secret-key-17
--- error_code: 422
--- error_log eval
qr/\[info\] .*idempotency: MISMATCH \(the key was used for a different request\), key_hash=${\ main::key_hash('secret-key-17')}/
--- no_error_log
secret-key-17



=== TEST 18: Redis down: an [error] line with the key's hash and the reason
--- skip_eval: 3: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- log_level: info
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_ctl('kill');
select(undef, undef, undef, 0.3 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: secret-key-18
--- error_code: 503
--- error_log eval
qr/\[error\] .*idempotency: Redis failed, request refused with 503, key_hash=${\ main::key_hash('secret-key-18')}/
--- no_error_log
secret-key-18



=== TEST 19: Redis is back for the blocks after
--- skip_eval: 1: !$ENV{TEST_NGINX_REDIS_CTL}
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::redis_ctl('start');
select(undef, undef, undef, 2.5 * $main::Slow);
--- request
POST /t
x
--- more_headers
Idempotency-Key: back-19
--- error_code: 201



=== TEST 20: Redis paused under a claim: a timeout, the connection replaced, ERROR
--- skip_eval: 7: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::FailHttpConfig
--- config eval: $::FailConfig
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
# a request first: the connection is ready, its handshake is over
Test::More::is(main::post('/t', 'warm-20'), 201, 'Redis is there');
# and its store is done: a store queued behind the pause would time out
# first and take the claim down with its connection ("failed")
select(undef, undef, undef, 0.5 * $main::Slow);
main::redis_pause_all(int(1500 * $main::Slow));
Test::More::is(main::post('/t', 'pause-20'), 503, 'refused');
select(undef, undef, undef, 2.5 * $main::Slow);
my $s = main::status_json();
Test::More::is($s->{requests}{ERROR}, 1, 'ERROR');
Test::More::cmp_ok($s->{redis}{timeouts}, '>=', 1, 'a command timed out');
Test::More::cmp_ok($s->{redis}{connection_errors}, '>=', 1,
                   'the connection was dropped');
--- request
GET /status
--- error_code: 200
--- error_log eval
qr/\[error\] .*idempotency: Redis timed out, request refused with 503, key_hash=${\ main::key_hash('pause-20')}/



=== TEST 21: scripts flushed in Redis: the NOSCRIPT error replies are counted, the request is served
--- skip_eval: 8: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::FailHttpConfig
--- config eval: $::FailConfig
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
# a request first: the scripts were loaded before they are flushed
Test::More::is(main::post('/t', 'warm-21'), 201, 'Redis is there');
select(undef, undef, undef, 0.2 * $main::Slow);
main::redis_cli('SCRIPT', 'FLUSH');
Test::More::is(main::post('/t', 'flush-21'), 201, 'served');
select(undef, undef, undef, 0.2 * $main::Slow);
my $s = main::status_json();
Test::More::is($s->{requests}{MISS}, 2, 'MISS');
Test::More::is($s->{responses}{stored}, 2, 'stored');
Test::More::cmp_ok($s->{redis}{error_replies}, '>=', 1, 'NOSCRIPT counted');
Test::More::is($s->{redis}{replies}, $s->{redis}{commands},
               'every command (the EVAL resends too) has its reply');
Test::More::is($s->{store_failures}{redis_error}, 0, 'no store failed');
--- request
GET /status
--- error_code: 200



=== TEST 22: a claim removed while its request runs: the renewal and the store find it gone
# as after an eviction, or a Redis without persistence restarting
--- skip_eval: 6: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::FailHttpConfig
--- config eval: $::FailConfig
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
use Digest::SHA ();
main::first_request('/fence', 'fence-22');
main::redis_cli('DEL', $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('test:')
                       . ':fence-22');
select(undef, undef, undef, 2.5 * $main::Slow);
my $s = main::status_json();
Test::More::is($s->{responses}{stored}, 1, 'the store was sent');
Test::More::is($s->{store_failures}{claim_lost}, 1, 'and refused: fenced');
Test::More::cmp_ok($s->{claims}{lost}, '>=', 1,
                   'a renewal found the claim gone');
--- request
GET /status
--- error_code: 200
--- error_log eval
[qr/\[warn\] .*idempotency: the claim on key_hash=${\ main::key_hash('fence-22')} was lost while its request was running/,
 qr/\[warn\] .*idempotency: the claim on key_hash=${\ main::key_hash('fence-22')} was lost \(/]



=== TEST 23: Redis killed as a response completes: the store is parked, then given up at the claim's end
--- skip_eval: 7: !$ENV{TEST_NGINX_REDIS_CTL}
--- http_config eval: $::FailHttpConfig
--- config eval: $::FailConfig
--- init
return if !$ENV{TEST_NGINX_REDIS_CTL};    # skipped (the real Test::Nginx runs init anyway)
main::first_request('/park', 'park-23');
main::redis_ctl('kill');
select(undef, undef, undef, 4 * $main::Slow);
main::redis_ctl('start');
select(undef, undef, undef, 1.5 * $main::Slow);
my $s = main::status_json();
Test::More::is($s->{responses}{stored}, 1, 'the store was sent');
Test::More::is($s->{redis}{parked}, 1, 'kept for a retry');
Test::More::is($s->{redis}{given_up}, 1, 'given up');
Test::More::is($s->{store_failures}{given_up}, 1, 'the response is lost');
Test::More::cmp_ok($s->{redis}{reconnects}, '>=', 1, 'reconnected');
--- request
GET /status
--- error_code: 200
--- error_log eval
qr/\[error\] .*idempotency: gave up storing the response for key_hash=${\ main::key_hash('park-23')} \(its deadline passed/



=== TEST 24: misuse: idempotency_status takes no arguments
--- config
    location = /status {
        idempotency_status on;
    }
--- must_die
--- error_log
invalid number of arguments in "idempotency_status" directive



=== TEST 25: misuse: idempotency_status only in a location
--- config
    idempotency_status;
--- must_die
--- error_log
"idempotency_status" directive is not allowed here



=== TEST 26: misuse: idempotency_status twice
--- config
    location = /status {
        idempotency_status;
        idempotency_status;
    }
--- must_die
--- error_log
"idempotency_status" directive is duplicate



=== TEST 27: per-location counters: each label counts its own locations' outcomes, results and cache lookups
--- http_config eval: $::LabelHttpConfig
--- config eval: $::LabelConfig
--- init
my $k = "loc-$$-" . time();
Test::More::is(main::post('/pay', "$k-1", 'a'), 201, 'payments: MISS');
Test::More::is(main::post('/pay', "$k-1", 'a'), 201, 'payments: HIT (from the cache)');
Test::More::is(main::post('/pay', "$k-1", 'b'), 422, 'payments: MISMATCH');
Test::More::is(main::post('/ord', undef, 'a'), 400, 'orders: MISSING');
Test::More::is(main::post('/ord', "$k-2", 'a'), 201, 'orders: MISS');
Test::More::is((main::http('GET', '/plain'))[0], 201, 'default: BYPASS');
Test::More::is(main::post('/nested/in', "$k-3", 'a'), 201, 'nested: MISS');

# a request is counted when it is logged, which may come after the client
# saw the connection's end (a lingering close): wait for all seven
my $s;
for (1 .. 100 * $main::Slow) {
    $s = main::status_json();
    my $n = 0;
    $n += $_ for values %{ $s->{requests} };
    last if $n >= 7;
    select(undef, undef, undef, 0.1);
}
my $l = main::locations_json($s);
Test::More::is_deeply([sort keys %$l],
                      [sort 'payments', 'orders', 'default', 'api/v2:nested'],
                      'one group per name, "default" for the location that names none');
my %want = (
    payments => { 'requests.MISS' => 1, 'requests.HIT' => 1,
                  'requests.MISMATCH' => 1, 'responses.stored' => 1,
                  'cache.hits' => 2, 'cache.misses' => 1 },
    orders => { 'requests.MISSING' => 1, 'requests.MISS' => 1,
                'responses.stored' => 1 },
    default => { 'requests.BYPASS' => 1 },
    'api/v2:nested' => { 'requests.MISS' => 1, 'responses.stored' => 1 },
);
for my $name (sort keys %want) {
    my %got = map { $_ => $l->{$name}{$_} } grep { $l->{$name}{$_} } keys %{ $l->{$name} };
    Test::More::is_deeply(\%got, $want{$name}, "$name: its own counts, the others 0")
        or Test::More::diag(JSON::PP->new->canonical->encode($l->{$name}));
}

# the node-wide totals are the sums of the locations'
my $f = main::flat($s);
for my $c (grep { /^(?:requests|responses)\./ || /^cache\.(?:hits|misses)$/ } sort keys %$f) {
    my $sum = 0;
    $sum += $l->{$_}{$c} // 0 for keys %$l;
    Test::More::is($sum, $f->{$c}, "$c: the total is the locations' sum");
}

# the same counts in the Prometheus output, a family per kind
my $fam = eval { main::parse_prometheus(main::status_prometheus()) };
Test::More::ok($fam, 'the exposition format is valid') or Test::More::diag($@);
Test::More::is_deeply(main::locations_prometheus($fam // {}), $l,
                      'label location="NAME": the counts of the JSON');
--- request
GET /status
--- error_code: 200



=== TEST 28: per-location counters go on across a reload; a name no longer configured is gone, a new one starts at 0
--- skip_eval: 5: $ENV{TEST_NGINX_USE_VALGRIND}
--- init
return if $ENV{TEST_NGINX_USE_VALGRIND};    # skipped (the real Test::Nginx runs init anyway)
my $before = main::status_json()->{locations};
my $conf = "$ENV{TEST_NGINX_SERVER_ROOT}/conf/nginx.conf";
my $text = do { local (@ARGV, $/) = $conf; <> };
$text =~ s/idempotency_metrics_label orders;/idempotency_metrics_label orders-v2;/
    or die "no orders label in $conf\n";
open my $fh, '>', $conf or die "$conf: $!";
print $fh $text;
close $fh;
open my $pf, '<', "$ENV{TEST_NGINX_SERVER_ROOT}/logs/nginx.pid" or die $!;
chomp(my $pid = <$pf>);
kill 'HUP', $pid or die "cannot HUP $pid";
# the new workers answer once the status names the new label
my $after;
for (1 .. 100 * $main::Slow) {
    $after = eval { main::status_json()->{locations} } // {};
    last if $after->{'orders-v2'};
    select(undef, undef, undef, 0.1);
}
Test::More::ok($after->{'orders-v2'}, 'the reloaded configuration answers');
Test::More::is_deeply($after->{payments}, $before->{payments},
                      'payments: its counts kept');
Test::More::ok(!exists $after->{orders}, 'orders: no longer shown');
Test::More::is_deeply([grep { $_ } values %{ main::locations_json({ locations => $after })->{'orders-v2'} }],
                      [], 'orders-v2: starts at 0');
Test::More::is(main::post('/ord', undef, 'a'), 400, 'orders-v2: MISSING');
--- request
GET /status
--- error_code: 200



=== TEST 29: misuse: idempotency_metrics_label with a character that would need escaping
--- config
    location = /t {
        idempotency_metrics_label "pay ments";
    }
--- must_die
--- error_log
invalid "idempotency_metrics_label" name "pay ments": only letters, digits and "_-.:/" are allowed



=== TEST 30: misuse: idempotency_metrics_label twice in a location, or outside one
--- config
    location = /t {
        idempotency_metrics_label a;
        idempotency_metrics_label b;
    }
--- must_die
--- error_log
"idempotency_metrics_label" directive is duplicate



=== TEST 31: misuse: idempotency_metrics_label only in a location
--- config
    idempotency_metrics_label a;
--- must_die
--- error_log
"idempotency_metrics_label" directive is not allowed here



=== TEST 32: nginx -t refuses a 65th name (the zone holds 64 per configuration)
--- config eval
CORE::join "", map { "    location = /l$_ { idempotency_metrics_label l$_; }\n" } 1 .. 65
--- must_die
--- error_log
too many idempotency_metrics_label names: at most 64 in one configuration
