# With "resolve", the two connections a worker has to a single server (the
# pipelined one, and the second one that carries large records' chunks)
# are on the same server: the second one goes where the first one is,
# never where its own answer of the name would send it.
#
# The name's answer lists several addresses while the first connection is
# on one of them (a DNS move that serves old and new addresses for a
# while, or a name with several records): before, the second connection
# resolved the name itself, took the answer's first address or, from
# nginx's resolver cache, a random one (nginx rotates cached answers), and
# put a large record's chunks on another server than its head (the store
# was refused) or on none.  Each round starts a fresh nginx (the
# connections keep the address they have while the answer holds it), each
# round's record must be whole on the first connection's server, and
# nothing on the other.
# At the end the name moves to the other server alone: the second
# connection moves with the first one.
#
# A plain Test::More file: two redis-servers on 127.0.0.2 and 127.0.0.3 at
# one port, a DNS server of the test (t/lib/TinyDNS.pm, TTL 1 s) and its
# own nginx, all stopped by pid.  Run from the repository root.

use strict;
use warnings;
use Test::More;
use File::Path ();
use File::Spec ();
use File::Temp ();

use lib 't/lib';
use IdemTest ();
use Roads ();
use TinyDNS;

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};
plan skip_all => 'redis-server and redis-cli are needed'
    unless `sh -c 'command -v redis-server && command -v redis-cli'`
           =~ /redis-cli/;

my ($A, $B) = ('127.0.0.2', '127.0.0.3');
my $Rounds = 5;

my $base = -d 'build/test' ? 'build/test' : File::Spec->tmpdir;
my $dir = File::Spec->rel2abs(File::Temp::tempdir('t198-XXXXXX',
                                                   DIR => $base));
chmod 0755, $dir;

my %redis;
my $rport = IdemTest::free_port_on($A, $B);
my $port = IdemTest::free_port();

$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

my $dns = TinyDNS->new(dir => $dir, ttl => 1);

for my $ip ($A, $B) {
    $redis{$ip} = IdemTest::start_redis_on($ip, $rport, $dir) or do {
        stop_all();
        plan skip_all => "redis-server on $ip:$rport did not start";
    };
}

# over the 256 KiB a command needs to go on the second connection
mkdir "$dir/html";
my $big = join '', map { chr(65 + $_ % 26) } 0 .. 600 * 1024;
Roads::write_file("$dir/html/big", $big);

for my $round (1 .. $Rounds) {
    $dns->set('redis.test' => $A);

    Roads::start_nginx($dir, $port, <<HTTP, 1);
    resolver 127.0.0.1:@{[ $dns->port ]} valid=1s ipv6=off;
    resolver_timeout 2s;

    idempotency_scope "test:";
    idempotency_redis redis.test:$rport resolve prefix=t198:
                      timeout=2s connect_timeout=1s;

    server {
        listen 127.0.0.1:$port;

        location = /small {
            idempotency on;
            proxy_pass http://127.0.0.1:$port/backend;
        }

        location = /big {
            idempotency on;
            proxy_method GET;
            proxy_pass http://127.0.0.1:$port/files/big;
        }

        location /files/ {
            alias $dir/html/;
        }

        location = /backend {
            return 201 "ran\\n";
        }
    }
HTTP

    ok(Roads::wait_for(20, sub { post('/small', "small-$round") =~ /^201 / }),
       "round $round: the first connection is up, on $A");

    # the name now lists B first, three addresses where nothing listens,
    # and A last; the first connection keeps its address (the answer holds
    # it) once it asked again
    my $asked = $dns->asked('redis.test');
    $dns->set('redis.test' => "$B,127.0.0.4,127.0.0.5,127.0.0.6,$A");
    ok(Roads::wait_for(20, sub { $dns->asked('redis.test') > $asked }),
       "round $round: nginx asked the name again");

    like(post('/big', "big-$round"), qr/^200 /,
         "round $round: a large record (the second connection)");
    my $again = post('/big', "big-$round");
    like($again, qr/^200 .*Idempotent-Replayed: true/s,
         "round $round: it is replayed (stored whole)");
    ok(index($again, $big) > 0, "round $round: byte for byte");

    ok(keys_on($A) > 0, "round $round: the record is on $A");
    is(keys_on($B), 0, "round $round: nothing of it on $B");

    last_round_moves() if $round == $Rounds;

    Roads::stop();
    cli($_, 'FLUSHALL') for $A, $B;
}

my $log = Roads::slurp("$dir/nginx/logs/error.log");
unlike($log, qr/\[(?:alert|crit|emerg)\]/, 'no alert in the error log');
unlike($log, qr/chunk was missing/, 'no store refused for a missing chunk');

stop_all();
File::Path::remove_tree($dir) if Test::More->builder->is_passing;
done_testing();


# the name moves to B alone: the first connection moves when its answer's
# validity ends, and the second one, connected on A, goes with it
sub last_round_moves {
    cli($_, 'FLUSHALL') for $A, $B;
    $dns->set('redis.test' => $B);

    my $n = 0;
    ok(Roads::wait_for(30, sub {
           post('/small', 'moved-' . ++$n) =~ /^201 / && keys_on($B) > 0
       }), 'the name moves to B: the first connection follows it');
    ok(Roads::wait_for(20, sub {
           Roads::slurp("$dir/nginx/logs/error.log")
           =~ /the second connection moves from \Q$A\E:$rport to \Q$B\E:$rport, where the first one is/
       }), 'the second connection moves with it (logged)');

    # what the first connection stored on A before it moved
    cli($A, 'FLUSHALL');

    like(post('/big', 'big-moved'), qr/^200 /,
         'a large record after the move');
    like(post('/big', 'big-moved'), qr/^200 .*Idempotent-Replayed: true/s,
         'is replayed (stored whole)');
    is(keys_on($A), 0, 'nothing of it on A');
}

sub cli {
    my ($ip, @args) = @_;
    my $out = `redis-cli -h $ip -p $rport @args 2>/dev/null`;
    chomp $out;
    return $out;
}

sub keys_on {
    my ($ip) = @_;
    return scalar grep { length } split /\n/,
        cli($ip, '--scan', '--pattern', "'t198:*'");
}

# "status headers... body" of a POST with a key, or '' when none came
sub post {
    my ($uri, $key) = @_;
    my $r = IdemTest::exchange($port,
                               "POST $uri HTTP/1.0\r\nHost: localhost\r\n"
                               . "Idempotency-Key: $key\r\n"
                               . "Content-Length: 0\r\n\r\n", 20);
    $r =~ s{^HTTP/1\.\d }{};
    return $r;
}

sub stop_all {
    Roads::stop();
    for my $ip (keys %redis) {
        kill 'TERM', $redis{$ip};
        waitpid($redis{$ip}, 0);
    }
    %redis = ();
    $dns->stop if $dns;
}

END { stop_all() }
