# A real payments client with a timeout shorter than the upstream, against
# the default configuration (issue 12, case 4): stripe-python (Debian's
# python3-stripe) with a 1 s timeout and automatic retries creates a charge
# through nginx, whose location says nothing but "idempotency on;"; the
# upstream (a Stripe-like API on loopback, t/lib/Roads.pm) takes 2 s to
# answer.  The first attempt times out, the client retries with the same
# Idempotency-Key (409 while the charge runs, with Retry-After), and must
# end with the one charge the upstream made: exactly one execution, and
# the charge id the client got is that execution's.
#
# A plain Test::More file: it starts its own nginx and upstream on free
# 127.0.0.1 ports and stops them by pid; Redis is make test's
# (TEST_NGINX_REDIS_PORT).

use strict;
use warnings;
use Test::More;
use File::Spec ();
use POSIX ();
use JSON::PP ();
use lib 't/lib';
use Roads ();
use Time::HiRes qw(sleep time);

plan skip_all => 'TEST_NGINX_LOAD_MODULES is not set (run via make test)'
    unless $ENV{TEST_NGINX_LOAD_MODULES};

# Debian's python3-stripe is for /usr/bin/python3, which need not be the
# first python3 on PATH
my ($Python) = grep {
    $_ && -x $_
    && system("'$_' -c 'import stripe, stripe.http_client' 2>/dev/null") == 0
} '/usr/bin/python3', Roads::which('python3');
plan skip_all => 'no python3 with stripe-python (python3-stripe, '
                 . 'scripts/setup.sh test)' unless $Python;

my $redis_port = $ENV{TEST_NGINX_REDIS_PORT} || 6379;
plan skip_all => "no Redis on 127.0.0.1:$redis_port"
    unless Roads::port_open($redis_port);

my $Slow = $Roads::Slow;
my $dir = Roads::tempdir('t152');
my $run = sprintf 'r%d%d', time % 100000, $$;
my ($port, $bport) = map { Roads::free_port() } 1 .. 2;

$SIG{INT} = $SIG{TERM} = sub { Roads::stop(); exit 130 };

$Roads::ChargeDelay = 2 * $Slow;
Roads::start_backend($dir, $bport);

# the location of a new user: "idempotency on;" and nothing else (the
# scope is the Authorization header stripe-python sends: the API key)
Roads::start_nginx($dir, $port, <<CONF);
    idempotency_redis 127.0.0.1:$redis_port prefix=t152-$run:;

    server {
        listen 127.0.0.1:$port;

        location /v1/ {
            idempotency on;
            proxy_pass http://127.0.0.1:$bport;
        }
    }
CONF

# The client, as its documentation configures it: api_base, api_key,
# max_network_retries and the HTTP client's timeout (seconds).  Prints
# one JSON line; stripe-python's log (its retries) goes to stderr.
my $client = <<'PY';
import json, sys
import stripe
from stripe import http_client

port, key, retries = sys.argv[1:4]
stripe.api_base = "http://127.0.0.1:" + port
stripe.api_key = "sk_test_roads"
stripe.max_network_retries = int(retries)
stripe.default_http_client = http_client.RequestsClient(timeout=1)
stripe.log = "info"
try:
    ch = stripe.Charge.create(amount=100, currency="usd", source="tok_visa",
                              idempotency_key=key)
    print(json.dumps({"ok": True, "id": ch.id, "amount": ch.amount,
                      "version": stripe.version.VERSION}))
except stripe.error.StripeError as e:
    print(json.dumps({"ok": False, "error": type(e).__name__,
                      "status": e.http_status, "message": str(e),
                      "version": stripe.version.VERSION}))
PY

sub charge {
    my ($key) = @_;
    my $pid = open(my $out, '-|');
    die "fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        open STDERR, '>', "$dir/client-$key.log";
        exec $Python, '-c', $client, $port, $key, 5 * $Slow
            or POSIX::_exit(127);
    }
    my $line = do { local $/; <$out> } // '';
    close $out;
    my $res = eval { JSON::PP->new->decode($line) }
              || { ok => 0, error => "no answer: $line" };
    $res->{log} = Roads::slurp("$dir/client-$key.log");
    return $res;
}

my $key = "$run-charge-1";
my $t = time;
my $res = charge($key);
my $took = time - $t;
note "stripe-python $res->{version}: " . ($res->{ok} ? "charge $res->{id}"
     : "$res->{error} ($res->{status}): $res->{message}")
     . sprintf(' after %.1f s', $took);

like($res->{log}, qr/Initiating retry/,
     'the first attempt timed out and stripe-python retried')
    or diag $res->{log};
ok($res->{ok}, "stripe-python's own retries end with a charge")
    or diag "$res->{error} ($res->{status}): $res->{message}\n$res->{log}";

# the upstream's 2 s have passed for every attempt
sleep 0.2 while time < $t + 3 * $Slow;
my $log = Roads::slurp("$dir/execs.log");
my @runs = $log =~ /^\Q$key\E (\d+)$/mg;
is(scalar @runs, 1, 'the upstream charged exactly once');
is($res->{id}, @runs ? "ch_$runs[0]" : 'ch_?',
   'the client got the charge the upstream made');

# the same call again, later: the stored charge, the upstream not called
my $again = charge($key);
is($again->{id} // 'no charge', @runs ? "ch_$runs[0]" : 'ch_?',
   'a later call with the same key gets the same charge')
    or diag "$again->{error} ($again->{status}): $again->{message}";
@runs = Roads::slurp("$dir/execs.log") =~ /^\Q$key\E (\d+)$/mg;
is(scalar @runs, 1, 'and the upstream is not called again');

Roads::stop();
done_testing();
