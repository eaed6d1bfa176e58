# Operations that run in a subrequest of the protected location's content
# handler (a Lua ngx.location.capture here; an njs r.subrequest() is the
# same to the module): the request itself sets up no upstream, so whether
# the operation ran cannot be seen from it.  A request that then ends
# without a response header (the client left, ngx.exit(444), a Lua error)
# is held as unknown, never released: a retry must not run it again.
#
# Needs Debian's libnginx-mod-http-lua (with its NDK), which loads only
# into Debian's nginx: skipped elsewhere, and under valgrind (LuaJIT).

BEGIN {
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $dir = '/usr/lib/nginx/modules';
    my $skip;

    if ($ENV{TEST_NGINX_USE_VALGRIND}) {
        $skip = 'LuaJIT under valgrind';

    } elsif (!-e "$dir/ngx_http_lua_module.so") {
        $skip = 'no libnginx-mod-http-lua';

    } else {
        my $t = "/tmp/t155-$$";
        mkdir $t;
        mkdir "$t/logs";
        open my $c, '>', "$t/nginx.conf" or die "$t/nginx.conf: $!";
        print $c "load_module $dir/ndk_http_module.so;\n"
                 . "load_module $dir/ngx_http_lua_module.so;\n"
                 . "error_log $t/error.log;\n"
                 . "events {}\n";
        close $c;
        my $out = `'$nginx' -t -p '$t' -c '$t/nginx.conf' 2>&1`;
        $skip = 'the Lua module does not load into this nginx' if $?;
        system('rm', '-rf', $t);
    }

    if ($skip) {
        require Test::More;
        Test::More::plan(skip_all => $skip);
    }
}

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;
$ENV{TEST_NGINX_PREFIX} ||= "t155-$$-" . time() . ":";

our $MainConfig = q{
    load_module /usr/lib/nginx/modules/ndk_http_module.so;
    load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
};

our $HttpConfig = qq{
    log_format exec 'EXEC \$uri';
    # the test clients send no credentials: "test:" is their shared scope
    idempotency_scope "test:\$http_authorization";
    idempotency_redis 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}
                      prefix=$ENV{TEST_NGINX_PREFIX};
};

our $Config = q{
    # the operation runs in a subrequest, then the request ends without a
    # response header
    location = /capture-then-444 {
        idempotency on;
        content_by_lua_block {
            ngx.location.capture("/backend")
            ngx.exit(444)
        }
    }

    # the same, answered: stored and replayed as any response
    location = /capture-then-say {
        idempotency on;
        content_by_lua_block {
            local res = ngx.location.capture("/backend")
            ngx.status = 201
            ngx.say("captured: ", res.body)
        }
    }

    location = /backend {
        internal;
        log_subrequest on;
        access_log logs/error.log exec;
        return 200 "ran";
    }
};

no_shuffle();
run_tests();

__DATA__

=== TEST 1: an operation in a subrequest, then no header: a retry does not run it again
--- main_config eval: $::MainConfig
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/capture-then-444', 'sub-444');
--- request
POST /capture-then-444
x
--- more_headers
Idempotency-Key: sub-444
--- error_code: 502
--- grep_error_log eval: qr/EXEC \S+/
--- grep_error_log_out
EXEC /backend
--- error_log
did not complete, the outcome is unknown and held for idempotency_ttl



=== TEST 2: an operation in a subrequest, answered: stored and replayed, run once
--- main_config eval: $::MainConfig
--- http_config eval: $::HttpConfig
--- config eval: $::Config
--- init
main::first_request('/capture-then-say', 'sub-say');
--- request
POST /capture-then-say
x
--- more_headers
Idempotency-Key: sub-say
--- error_code: 201
--- response_body
captured: ran
--- response_headers
Idempotent-Replayed: true
--- grep_error_log eval: qr/EXEC \S+/
--- grep_error_log_out
EXEC /backend
