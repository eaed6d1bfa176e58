# The ACL user of docs/operations.md is enough for the module and limited
# to the key prefix: the line is taken from the page and run as written
# against the test Redis, every command src/ sends (from C and from the
# Lua scripts) is among those it allows, and a request goes through MISS
# and HIT as that user; a prefix outside the user's key pattern is refused.

use Test::Nginx::Socket 'no_plan';
use Test::More;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} = "idem:t130-$$-" . time() . ":";

my @cli = ('redis-cli', '-h', '127.0.0.1', '-p', $ENV{TEST_NGINX_REDIS_PORT});

sub slurp {
    open my $h, '<', $_[0] or die "$_[0]: $!\n";
    local $/;
    return <$h>;
}

# the line as an operator copies it, continuation lines joined
my ($acl) = slurp('docs/operations.md')
    =~ /^(redis-cli ACL SETUSER (?:[^\n]*\\\n)*[^\n]*)$/m;
ok($acl, 'docs/operations.md has a redis-cli ACL SETUSER line');
$acl =~ s/\\\n\s*/ /g;

# its words after "redis-cli ACL SETUSER", as the shell splits them
my $rest = $acl =~ s/^redis-cli ACL SETUSER //r;
my @words = split /\n/,
    qx{sh -c 'for w do printf "%s\\n" "\$w"; done' sh $rest};
my ($user) = @words;
my ($pass) = map { /^>(.*)/ ? $1 : () } @words;
my %allowed = map { /^\+(.*)/ ? (lc $1 => 1) : () } @words;
ok($user && $pass, "user $user with a password");
ok(grep({ $_ eq '~idem:*' } @words), 'restricted to the keys ~idem:*');

# what src/ sends: the C side's command names, the scripts' redis.call()s
my %used;
# (the Sentinel side talks to the sentinels, not to the data Redis)
for my $f (grep { !/_sentinel\.c$/ } glob('src/*.c')) {
    my $c = slurp($f);
    $used{lc $1} = $f while $c =~ /argv\[(?:0|argc\+\+|argc)\]\s*=\s*"([A-Z]+)"/g;
    $used{'script|' . lc $1} = $f
        while $c =~ /argv\[0\]\s*=\s*"SCRIPT";(?:(?!argv\[0\]).)*?argv\[1\]\s*=\s*"([A-Z]+)"/gs;
    delete $used{script};
    $used{lc $1} = $f while $c =~ /\bcmd\s*=\s*"([A-Z]+)"/g;
}
for my $f (glob('src/lua/*.lua')) {
    my $c = slurp($f);
    $used{lc $1} = $f while $c =~ /redis\.p?call\(\s*'(\w+)'/g;
}
ok($used{evalsha}, 'found the commands src/ sends (EVALSHA among them)');
delete $used{auth};    # allowed to every user
# ROLE is sent only behind Sentinel: the page says to add +role there
like(slurp('docs/operations.md'), qr/Sentinel.*`\+role`/s,
     'docs/operations.md says to add +role behind Sentinel')
    if delete $used{role};
for my $cmd (sort keys %used) {
    ok($allowed{$cmd} || ($cmd =~ /^(\w+)\|/ && $allowed{$1}),
       "$cmd (sent by $used{$cmd}) is allowed by the ACL line");
}

# the page's SCRIPT LOAD row names every script a worker loads: each
# src/lua/*.lua, whatever the configuration (a cache zone or not)
my ($load_row) = slurp('docs/operations.md') =~ /^(\| `SCRIPT LOAD` .*)$/m;
ok($load_row, 'docs/operations.md has a SCRIPT LOAD row');
for my $f (glob('src/lua/*.lua')) {
    my ($name) = $f =~ m{([^/]+)\.lua$};
    like($load_row // '', qr/`\Q$name\E`/,
         "the SCRIPT LOAD row names the script $name");
}

# run it as written, against the test Redis; Redis 6.0 has no channel
# rights and refuses their words: the page says to leave them out there
my $line = $acl =~ s/^redis-cli /@cli /r;
my ($version) = `@cli INFO server` =~ /^redis_version:(\d+\.\d+)/m;
$line =~ s/ (?:resetchannels|'&[^']*')//g if defined $version && $version < 6.2;
my $out = `$line 2>&1`;
is($out, "OK\n", 'the ACL SETUSER line runs as written') or diag($out);
$ENV{TEST_NGINX_ACL_USER} = $user;
$ENV{TEST_NGINX_ACL_PASS} = $pass;

END {
    system("@cli ACL DELUSER $user > /dev/null 2>&1") if $user;
}

our $HttpConfig = q{
    log_format exec 'EXEC $request_method $uri $http_idempotency_key';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:$http_authorization";
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT
                      user=$TEST_NGINX_ACL_USER password=$TEST_NGINX_ACL_PASS
                      prefix=$TEST_NGINX_PREFIX timeout=1s;
};

our $Config = q{
    location = /t {
        idempotency on;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /outside {
        idempotency on;
        idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT
                          user=$TEST_NGINX_ACL_USER
                          password=$TEST_NGINX_ACL_PASS prefix=other:;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }

    location = /backend {
        access_log logs/error.log exec;
        return 201 "created\n";
    }

    location = /admin {
        idempotency_admin;
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: as the ACL user, a new key runs and is recorded (MISS)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: acl-1
--- error_code: 201
--- response_body
created
--- grep_error_log: EXEC POST /backend acl-1
--- grep_error_log_out
EXEC POST /backend acl-1
--- no_error_log
[error]



=== TEST 2: as the ACL user, the retry is replayed (HIT)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: acl-1
--- error_code: 201
--- response_headers
Idempotent-Replayed: true
--- response_body
created
--- no_error_log
EXEC POST
[error]



=== TEST 2a: as the ACL user, an admin DELETE removes the record (the purge script's GET, DEL and PUBLISH)
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
DELETE /admin?key=acl-1&scope=test:
--- error_code: 204
--- no_error_log
[error]



=== TEST 2b: the removed key runs again
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /t
{"amount":1}
--- more_headers
Idempotency-Key: acl-1
--- error_code: 201
--- grep_error_log: EXEC POST /backend acl-1
--- grep_error_log_out
EXEC POST /backend acl-1
--- no_error_log
[error]



=== TEST 3: a prefix outside the user's key pattern is refused by Redis
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- request
POST /outside
{"amount":1}
--- more_headers
Idempotency-Key: acl-2
--- error_code: 503
--- response_headers
Content-Type: application/problem+json
--- error_log
NOPERM
--- no_error_log
EXEC POST
