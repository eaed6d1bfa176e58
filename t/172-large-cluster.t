# Split records in a Redis Cluster: the body of a large response lives in
# a second key that must be in its record's slot (a hash tag), so that the
# store script can check it and a replay finds it on the same master.  A
# real 3-master cluster (t/lib/IdemCluster.pm starts it and stops it by pid
# on every path); keys spread over all masters.

BEGIN {
    use lib 't/lib';
    require IdemCluster;
    require Test::More;

    my $why;
    if (`redis-server --version 2>/dev/null` !~ /v=(\d+)\./ || $1 < 6) {
        $why = 'no redis-server 6.0 or newer';
    } elsif (!($main::Cluster = IdemCluster->start(3))) {
        $why = "no Redis Cluster: $IdemCluster::Error";
    }
    Test::More::plan(skip_all => $why) if $why;
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;
use Digest::SHA ();
use File::Temp ();
use IO::Socket::INET ();

$ENV{TEST_NGINX_PREFIX} ||= "t172-$$-" . time() . ":";
$ENV{TEST_NGINX_CLUSTER_SEEDS} = $main::Cluster->seeds;

our $C = $main::Cluster;
our $Dir = File::Temp::tempdir('t172-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $Dir;    # read by nginx workers that may not be root

# 3 MiB: split, and read back in three slices
our $Body = join '', map { pack('N', $_) x 256 } 1 .. 3 * 1024;
{
    open my $fh, '>:raw', "$Dir/big.bin" or die "$Dir/big.bin: $!";
    print $fh $Body;
    close $fh or die "$Dir/big.bin: $!";
}
our $Sha = Digest::SHA::sha256_hex($Body);

our @Keys = map { "big-$_" } 1 .. 6;

our $HttpConfig = qq{
    log_format exec 'EXEC \$request_method \$uri \$http_idempotency_key';
    idempotency_redis $ENV{TEST_NGINX_CLUSTER_SEEDS} cluster
                      prefix=$ENV{TEST_NGINX_PREFIX} timeout=2s;
};

our $Config = qq{
    location = /big {
        idempotency on;
        idempotency_scope "t";
        idempotency_max_response_size 10m;
        proxy_buffering off;
        proxy_method GET;
        proxy_pass http://127.0.0.1:\$TEST_NGINX_SERVER_PORT/files/big.bin;
    }

    location /files/ {
        access_log logs/error.log exec;
        sendfile off;
        alias $Dir/;
    }
};

# one POST: (status, replayed header, body sha256)
sub post {
    my ($key) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1',
        PeerPort => $ENV{TEST_NGINX_SERVER_PORT},
        Timeout  => 20,
    ) or return (0);
    print $sock "POST /big HTTP/1.1\r\nHost: localhost\r\n"
                . "Idempotency-Key: $key\r\nContent-Length: 1\r\n"
                . "Connection: close\r\n\r\nx";
    local $/;
    my $resp = <$sock> // '';
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = $head =~ m{^HTTP/1\.1 (\d+)};
    my $replayed = $head =~ /^Idempotent-Replayed: true/mi ? 'replayed' : '';
    return ($status // 0, $replayed, Digest::SHA::sha256_hex($body // ''));
}

sub record_key {
    return $ENV{TEST_NGINX_PREFIX} . Digest::SHA::sha256_hex('t') . ":$_[0]";
}

# the first keys: stored; each on the master of its slot, split, with its
# body on the same master
sub store_all {
    for my $key (@Keys) {
        Test::More::is(join(' ', post($key)), "200  $Sha",
                       "$key: the first request");
    }

    my %masters;
    for my $key (@Keys) {
        my $rkey = record_key($key);
        my $i = $C->owner($C->cli(0, 'CLUSTER', 'KEYSLOT', $rkey));
        $masters{$i}++;
        my $end = time + 10;
        my $head = '';
        while (time < $end) {
            $head = $C->cli($i, 'GET', $rkey);
            last if $head =~ /^idem1 split /;
            select(undef, undef, undef, 0.1);
        }
        my ($owner) = $head =~ /^idem1 split [0-9a-f]+ ([0-9a-f]+) /;
        Test::More::ok($owner, "$key: a split record on its master");
        my $bkey = "$ENV{TEST_NGINX_PREFIX}\{$rkey\}:body:" . ($owner // '');
        # the body in chunks of 1 MiB, "<body key>:0", ":1" ...
        my $chunks = int((length($::Body) + 1048575) / 1048576);
        Test::More::is($C->cli(0, 'CLUSTER', 'KEYSLOT', "$bkey:0"),
                       $C->cli(0, 'CLUSTER', 'KEYSLOT', $rkey),
                       "$key: its body is in the record's slot");
        my $len = 0;
        $len += $C->cli($i, 'STRLEN', "$bkey:$_") for 0 .. $chunks - 1;
        Test::More::is($len, length $::Body,
                       "$key: the body is on the same master");
    }
    Test::More::cmp_ok(scalar keys %masters, '>=', 2,
                       'the records are on more than one master');
}

sub replay_all {
    for my $key (@Keys) {
        Test::More::is(join(' ', post($key)), "200 replayed $Sha",
                       "$key: the retry is replayed byte for byte");
    }
}

master_on();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: large records are stored split through the cluster, each body in its record's slot
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::store_all();
--- request
GET /files/big.bin
--- error_code: 200
--- no_error_log
[error]
[alert]



=== TEST 2: their retries are replayed byte for byte, and the upstream ran once per key
--- init
main::replay_all();
--- request
POST /big
x
--- more_headers
Idempotency-Key: big-1
--- error_code: 200
--- response_headers
Idempotent-Replayed: true
--- grep_error_log: EXEC GET /files/big.bin big-1
--- grep_error_log_out
EXEC GET /files/big.bin big-1
--- no_error_log
[error]
[alert]
