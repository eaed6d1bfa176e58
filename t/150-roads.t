# The conformance matrix (docs/behaviour.md, "Conformance matrix"): every
# road a protected request can take through nginx runs the operation
# exactly once and every retry gets a byte-identical replay.
#
#   protocol  HTTP/1.0, HTTP/1.1 (Perl sockets), HTTP/2 (h2c with prior
#             knowledge, t/lib/roads_h2.py with python3-h2: curl cannot
#             leave at a chosen moment, and a curl per request is too slow)
#   road      proxy_pass, fastcgi_pass (fcgiwrap), scgi_pass,
#             X-Accel-Redirect to a location, X-Accel-Redirect to a static
#             file, error_page to a named location
#   response  200 with a body, 201 chunked, 204, gzip, 2 MB spooled to a
#             temporary file (a static file of 2 MB on the file road)
#   client    stays, leaves before the header, leaves mid-body, retries at
#             once after the last byte
#
# A plain Test::More file: it starts its own nginx (2 workers), a counting
# backend (HTTP and SCGI, t/lib/Roads.pm) and fcgiwrap with t/lib/roads.cgi,
# all on free 127.0.0.1 ports, and stops each by pid; Redis is make test's
# (TEST_NGINX_REDIS_PORT).  The three protocols run side by side, one
# process each; in each, every cell first makes its own attempt (unique
# key), then, once its upstream had time to finish, two retries: the
# first may wait out a 409 while the operation runs, the second must be a
# replay (Idempotent-Replayed), both identical (status,
# Content-Type, Content-Encoding, body bytes) to each other and to the
# first attempt when that one was read to its end.  Then the backend's log
# must hold exactly one execution of the key.
#
# Cells that fail on the current code are listed in %KNOWN_FAIL (shell
# patterns over the cell names "PROTO/ROAD/RESPONSE/CLIENT", with the case
# of issue 12 that explains them): they run as TODO tests.  Empty the list
# when the fix lands.
#
# For work on one road: ROADS_ONLY=<regex over cell names> runs only those
# cells, ROADS_TIMES=1 notes how long each took, ROADS_KEEP=1 keeps the
# server directory (build/test/t150-*: nginx.conf, error.log, execs.log).

use strict;
use warnings;
use Test::More;
use lib 't/lib';
use File::Spec ();
use JSON::PP ();
use Roads ();
use Time::HiRes qw(sleep time);

our %KNOWN_FAIL = (
);

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'fcgiwrap is not installed (scripts/setup.sh test)'
    unless Roads::which('fcgiwrap') || -x '/usr/sbin/fcgiwrap';

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
plan skip_all => "no Redis on 127.0.0.1:$redis_port"
    unless Roads::port_open($redis_port);

my $Slow = $Roads::Slow;
# HTTP/2 needs nginx's http_v2 module and python3-h2 for the client
my $H2skip = `'@{[ $ENV{TEST_NGINX_BINARY} || '/usr/sbin/nginx' ]}' -V 2>&1`
             !~ /--with-http_v2_module/ ? 'nginx lacks HTTP/2'
           : !Roads::h2_python() ? 'python3-h2 is not installed'
           : undef;
my $H2 = !$H2skip;
my @Protos = qw(1.0 1.1 2);
my @Roads = qw(proxy fastcgi scgi accel-loc accel-file errpage);
my @Responses = qw(ok chunked 204 gzip big);
# under valgrind (make test-valgrind) every road and client, but not every
# protocol and response: the whole matrix would take many minutes there
if ($ENV{TEST_NGINX_USE_VALGRIND}) {
    @Protos = qw(1.1 2);
    @Responses = qw(ok chunked 204);
}
my @Clients = qw(stay leave_hdr leave_body quick);

# request path of each road
my %Path = (
    proxy        => '/proxy',
    fastcgi      => '/fastcgi',
    scgi         => '/scgi',
    'accel-loc'  => '/accel-loc',
    'accel-file' => '/accel-file',
    errpage      => '/errpage',
);

# a static file has no status or framing of its own to choose
my %NotARoad = map { ("accel-file/$_" => 1) } qw(chunked 204);

my $dir = Roads::tempdir('t150', $ENV{ROADS_KEEP});
my $run = sprintf 'r%d%d', time % 100000, $$;
my ($port, $h2port, $bport, $sport, $fport) =
    map { Roads::free_port() } 1 .. 5;

$SIG{INT} = $SIG{TERM} = sub { Roads::stop(); exit 130 };

Roads::static_files($dir);
Roads::start_backend($dir, $bport, $sport);
Roads::start_fcgiwrap($fport);

# the same buffers for every upstream module: a 2 MB answer is spooled
my $buffers = join '', map { <<BUF } qw(proxy fastcgi scgi);
    ${_}_buffer_size 4k;
    ${_}_buffers 4 4k;
    ${_}_busy_buffers_size 8k;
    ${_}_max_temp_file_size 16m;
    ${_}_temp_file_write_size 8k;
BUF

my $cgi = File::Spec->rel2abs('t/lib/roads.cgi');

Roads::start_nginx($dir, $port, <<CONF);
    idempotency_redis 127.0.0.1:$redis_port prefix=t150-$run:;

    types {
        application/json json;
        text/plain txt;
        application/octet-stream bin;
    }

    gzip on;
    gzip_types text/plain;
    gzip_min_length 1;
    gzip_http_version 1.0;
$buffers

    server {
        listen 127.0.0.1:$port sndbuf=32k;
        @{[ $H2 ? "listen 127.0.0.1:$h2port http2 sndbuf=32k;" : '' ]}

        location = /proxy {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:$bport;
        }

        location = /fastcgi {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            fastcgi_param SCRIPT_FILENAME $cgi;
            fastcgi_param ROADS_DIR $dir;
            fastcgi_param GATEWAY_INTERFACE CGI/1.1;
            fastcgi_param REQUEST_METHOD \$request_method;
            fastcgi_param REQUEST_URI \$request_uri;
            fastcgi_param QUERY_STRING \$query_string;
            fastcgi_param CONTENT_TYPE \$content_type;
            fastcgi_param CONTENT_LENGTH \$content_length;
            fastcgi_pass 127.0.0.1:$fport;
        }

        location = /scgi {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            scgi_param SCGI 1;
            scgi_param REQUEST_METHOD \$request_method;
            scgi_param REQUEST_URI \$request_uri;
            scgi_param QUERY_STRING \$query_string;
            scgi_pass 127.0.0.1:$sport;
        }

        # the backend answers with X-Accel-Redirect to /_loc/ or /_file/
        location = /accel-loc {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            proxy_pass http://127.0.0.1:$bport;
        }

        location = /accel-file {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            proxy_pass http://127.0.0.1:$bport;
        }

        location /_loc/ {
            internal;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:$bport/render/;
        }

        location /_loc/204/ {
            internal;
            return 204;
        }

        location /_file/ {
            internal;
            alias $dir/files/;
        }

        location = /errpage {
            error_page 418 = \@app;
            return 418;
        }

        location \@app {
            idempotency on;
            idempotency_scope "t";
            idempotency_max_response_size 4m;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:$bport;
        }
    }
CONF

my $t0 = time;

# shell pattern ('*' within a part of the name, '{a,b}') -> regex
sub glob_re {
    my ($g) = @_;
    my $re = join '', map {
        $_ eq '*' ? '[^/]*'
        : /^\{(.*)\}$/
            ? '(?:' . join('|', map { quotemeta } split /,/, $1) . ')'
        : quotemeta
    } split /(\*|\{[^}]*\})/, $g;
    return qr/\A$re\z/;
}

my @Known = map { [glob_re($_), $KNOWN_FAIL{$_}] } sort keys %KNOWN_FAIL;

sub known_fail {
    my ($name) = @_;
    for (@Known) {
        return $_->[1] if $name =~ $_->[0];
    }
    return undef;
}

sub cells {
    my ($proto) = @_;
    my @cells;
    for my $road (@Roads) {
        for my $resp (@Responses) {
            next if $NotARoad{"$road/$resp"};
            for my $client (@Clients) {
                my $pname = $proto eq '2' ? 'h2' : "http$proto";
                push @cells, { proto => $proto, road => $road,
                               resp => $resp, client => $client,
                               name => "$pname/$road/$resp/$client",
                               key => "$run-$pname-$road-$resp-$client" };
            }
        }
    }
    return grep { !$ENV{ROADS_ONLY} || $_->{name} =~ /$ENV{ROADS_ONLY}/ }
           @cells;
}

sub send_cell {
    my ($c, $mode) = @_;
    my @h;
    push @h, 'Accept-Encoding: gzip' if $c->{resp} eq 'gzip';
    push @h, 'X-Roads-Hdr-Delay: 0.5' if $c->{client} eq 'leave_hdr';
    push @h, 'X-Roads-Body-Delay: 0.5' if $c->{client} eq 'leave_body';
    return Roads::request(proto => $c->{proto},
                          port => $c->{proto} eq '2' ? $h2port : $port,
                          path => "$Path{$c->{road}}?r=$c->{resp}",
                          key => $c->{key}, headers => \@h,
                          mode => $mode // 'stay');
}

# the cell's own attempt (and the retry at once of "quick")
sub first_attempt {
    my ($c) = @_;
    my $mode = $c->{client} eq 'quick' ? 'stay' : $c->{client};
    my $t = time;
    $c->{first} = send_cell($c, $mode);
    note sprintf '%s: first attempt %.2f s', $c->{name}, time - $t
        if $ENV{ROADS_TIMES};
    $c->{quick} = send_cell($c) if $c->{client} eq 'quick';
    $c->{done} = time;
}

# retries: the first one waits out 409 (the operation still running) for
# a while, the second one must be a replay
sub settle {
    my ($c) = @_;
    my $ready = $c->{done} + 1.2 * $Slow;
    sleep $ready - time if $ready > time;
    my $give_up = $c->{done} + 6 * $Slow;
    my $a;
    while (1) {
        $a = send_cell($c);
        last unless ($a->{status} // 0) == 409 && time < $give_up;
        sleep 0.25;
    }
    $c->{retry} = $a;
    $c->{again} = send_cell($c);
    note sprintf '%s: settled at %.2f s', $c->{name}, time - $t0
        if $ENV{ROADS_TIMES};
}

# what each response must look like
my %Want = (
    ok      => { status => 200, type => 'application/json' },
    chunked => { status => 201, type => 'text/plain' },
    204     => { status => 204, length => 0 },
    gzip    => { status => 200, type => 'text/plain', encoding => 'gzip' },
    big     => { status => 200, length => 2097152 },
);

sub verdict {
    my ($c) = @_;
    my ($f, $q, $a, $b) = @$c{qw(first quick retry again)};
    my $sig = Roads::signature($a);
    my $want = $Want{ $c->{resp} };
    my @why;
    my $type = join ',', @{ $a->{headers}{'content-type'} || [] };
    my $enc = join ',', @{ $a->{headers}{'content-encoding'} || [] };
    push @why, "not the expected answer: status $a->{status}, type '$type',"
               . " encoding '$enc', " . length($a->{body} // '') . ' bytes'
        if $a->{status} != $want->{status}
           || (defined $want->{type} && $type !~ /^\Q$want->{type}\E/)
           || ($want->{encoding} // '') ne $enc
           || (defined $want->{length}
               && length($a->{body} // '') != $want->{length});
    push @why, 'retry: ' . Roads::describe($a)
        unless $a->{complete} && $a->{status} != 409;
    push @why, 'second retry: ' . Roads::describe($b)
        unless $b->{complete} && Roads::replayed($b);
    push @why, 'the retries differ: ' . Roads::describe($a) . ' / '
               . Roads::describe($b)
        unless Roads::signature($b) eq $sig;
    if ($c->{client} eq 'stay' || $c->{client} eq 'quick') {
        push @why, 'first attempt: ' . Roads::describe($f)
            unless $f->{complete};
        push @why, 'the first answer differs from the replay: '
                   . Roads::describe($f) . ' / ' . Roads::describe($a)
            unless Roads::signature($f) eq $sig;
    }
    if ($q) {
        push @why, 'retry at once after the last byte: '
                   . Roads::describe($q)
            unless $q->{complete} && Roads::replayed($q)
                   && Roads::signature($q) eq Roads::signature($f);
    }
    return @why;
}

# One lane per protocol, run side by side (each cell has its own key, so
# they do not meet); a lane hands back what it saw, the checks are made
# here.
sub lane {
    my ($proto) = @_;
    my @cells = cells($proto);
    first_attempt($_) for @cells;
    settle($_) for @cells;
    my @out;
    for my $c (@cells) {
        push @out, { name => $c->{name},
                     execs => Roads::execs($dir, $c->{key}),
                     why => [verdict($c)],
                     seen => 'first attempt ' . Roads::describe($c->{first})
                             . ', retry ' . Roads::describe($c->{retry}) };
    }
    return \@out;
}

my %lane;
for my $proto (@Protos) {
    next if $proto eq '2' && !$H2;
    my $file = "$dir/lane-$proto.json";
    $lane{$proto} = Roads::spawn(sub {
        my $out = eval { lane($proto) } || [{ name => "HTTP/$proto lane",
                                              execs => 0, why => ["$@"],
                                              seen => 'died' }];
        Roads::h2_stop();
        Roads::write_file($file, JSON::PP->new->encode($out));
    });
}

for my $proto (@Protos) {
    unless ($lane{$proto}) {
        SKIP: { skip "HTTP/2: $H2skip", 1 }
        next;
    }
    Roads::wait_pid($lane{$proto}, 300 * $Slow);
    my $out = eval {
        JSON::PP->new->decode(Roads::slurp("$dir/lane-$proto.json"))
    } || [{ name => "HTTP/$proto lane", execs => 0,
            why => ['no result from the lane'], seen => '' }];
    for my $r (@$out) {
        our $TODO;
        local $TODO = known_fail($r->{name});
        my @why = @{ $r->{why} };
        unshift @why, "$r->{execs} executions ($r->{seen})"
            if $r->{execs} != 1;
        ok(!@why, "$r->{name}: one execution, every retry the same replay")
            or diag "$r->{name}: " . join '; ', @why;
    }
    note sprintf 'HTTP/%s done after %.1f s', $proto, time - $t0;
}

# the 2 MB answers did take the temporary-file road of each module
my $log = Roads::slurp("$dir/nginx/logs/error.log");
for my $m ($ENV{ROADS_ONLY} || !grep({ $_ eq 'big' } @Responses) ? ()
           : qw(proxy fastcgi scgi)) {
    my $warn = 'an upstream response is buffered to a temporary file';
    like($log, qr/\Q$warn\E \S+\/${m}_temp\//,
         "$m: a 2 MB answer was spooled to a temporary file");
}
unlike($log, qr/\[(?:alert|crit|emerg)\]/, 'no alert in the error log')
    or diag join "\n", grep { /\[(?:alert|crit|emerg)\]/ } split /\n/, $log;

Roads::stop();
note sprintf 'matrix done in %.1f s', time - $t0;
done_testing();
