# Directives: every valid form passes "nginx -t", every invalid form fails it
# with a message naming the directive, and settings inherit
# http -> server -> location.  Errors found only once the whole http block
# is read name the directive's own file and line too (not the end of the
# block): those blocks run nginx -t on configurations of their own
# (IdemTest::nginx_t_http), whose lines they know.

use Test::Nginx::Socket 'no_plan';
use lib 't/lib';
use IdemTest;

$ENV{TEST_NGINX_REDIS_PORT} ||= 6379;

# nginx -t of an http block $http fails with a line like $re that ends
# "in FILE:LINE", LINE being where the text $at ends in that file
sub refused_at {
    my ($name, $http, $at, $re) = @_;

    my ($out, $conf) = nginx_t_http($http);
    my $line = conf_line($conf, $at);

    Test::More::unlike($out, qr/test is successful/, "$name: nginx -t fails");
    Test::More::like($out, qr/\[emerg\] .*$re.* in \Q$conf\E:$line$/m,
                     "$name: the message names the directive and "
                     . "nginx.conf:$line")
        or Test::More::diag($out);
}

no_shuffle();
run_tests();

__DATA__

=== TEST 1: every directive accepts its valid forms at every level
--- http_config
    idempotency off;
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT db=0 prefix=t001:
                      connect_timeout=250ms timeout=2s;
    idempotency_ttl 24h;
    idempotency_lock_ttl 60s;
    idempotency_methods POST PATCH;
    idempotency_required off;
    idempotency_scope $http_authorization;
    idempotency_header Idempotency-Key;
    idempotency_wait 0;
    idempotency_max_response_size 1m;
    idempotency_on_store_error closed;
    idempotency_store_status 1xx 2xx 3xx 4xx !408 !409 !425 !429;
    idempotency_key_max_length 255;
    idempotency_problem_type urn:ngx-idempotency:;
    idempotency_hide_header X-Debug;
    idempotency_pass_header Set-Cookie;
--- config
    idempotency_ttl 1h;
    idempotency_methods post put delete;

    location = /t {
        idempotency on;
        idempotency_redis unix:/tmp/t001-redis.sock db=15 password=secret
                          user=app;
        idempotency_ttl 10s;
        idempotency_lock_ttl 500ms;
        idempotency_methods POST;
        idempotency_required on;
        idempotency_scope "$http_x_tenant:$remote_user";
        idempotency_header X-Request-Key;
        idempotency_wait 2s poll=500ms;
        idempotency_max_response_size 1;
        idempotency_on_store_error open;
        idempotency_store_status 200 201 4xx !404;
        idempotency_key_max_length 1024;
        idempotency_problem_type https://docs.example.com/problems/;
        idempotency_hide_header X-Trace;
        idempotency_hide_header X-Internal;
        idempotency_pass_header set-cookie;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
--- no_error_log
[emerg]



=== TEST 2: a negative TTL is an error naming the directive
--- config
    location = /t {
        idempotency_ttl -1s;
    }
--- must_die
--- error_log
[emerg]
invalid time "-1s" in "idempotency_ttl" directive



=== TEST 3: a zero lock TTL is an error
--- config
    location = /t {
        idempotency_lock_ttl 0;
    }
--- must_die
--- error_log
[emerg]
invalid time "0" in "idempotency_lock_ttl" directive



=== TEST 4: an unparsable wait is an error
--- config
    idempotency_wait soon;
--- must_die
--- error_log
[emerg]
invalid time "soon" in "idempotency_wait" directive



=== TEST 4a: a negative wait is an error that names 0 as valid
--- config
    idempotency_wait -1;
--- must_die
--- error_log
[emerg]
invalid time "-1" in "idempotency_wait" directive, 0 or a positive time is expected



=== TEST 4c: the wait's fallback poll must be a positive time
--- config
    idempotency_wait 5s poll=0;
--- must_die
--- error_log
[emerg]
invalid time "0" in "idempotency_wait" directive, a positive time is expected



=== TEST 4d: the wait takes no other parameter than poll=
--- config
    idempotency_wait 5s every=1s;
--- must_die
--- error_log
[emerg]
invalid parameter "every=1s"



=== TEST 4b: a zero lock TTL asks for a positive time
--- config
    idempotency_lock_ttl 0s;
--- must_die
--- error_log
invalid time "0s" in "idempotency_lock_ttl" directive, a positive time is expected



=== TEST 5: an unknown method is an error
--- config
    location = /t {
        idempotency_methods POST FETCH;
    }
--- must_die
--- error_log
[emerg]
unknown method "FETCH" in "idempotency_methods" directive



=== TEST 6: an unparsable Redis address is an error
--- config
    location = /t {
        idempotency_redis 127.0.0.1:99999;
    }
--- must_die
--- error_log
[emerg]
invalid port in Redis address "127.0.0.1:99999" of "idempotency_redis" directive



=== TEST 7: an unknown Redis option is an error
--- config
    location = /t {
        idempotency_redis 127.0.0.1:6379 dbase=1;
    }
--- must_die
--- error_log
[emerg]
unknown option "dbase=1" in "idempotency_redis" directive



=== TEST 8: a bad Redis db number is an error
--- config
    location = /t {
        idempotency_redis 127.0.0.1:6379 db=one;
    }
--- must_die
--- error_log
[emerg]
invalid option value "db=one" in "idempotency_redis" directive



=== TEST 9: a bad Redis timeout is an error
--- config
    location = /t {
        idempotency_redis 127.0.0.1:6379 timeout=-5;
    }
--- must_die
--- error_log
[emerg]
invalid option value "timeout=-5" in "idempotency_redis" directive



=== TEST 10: a Redis user without a password is an error
--- config
    location = /t {
        idempotency_redis 127.0.0.1:6379 user=app;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: "user=" needs "password="



=== TEST 11: several addresses need cluster or sentinel
--- config
    location = /t {
        idempotency_redis 127.0.0.1:7000 127.0.0.1:7001;
    }
--- must_die
--- error_log
[emerg]
several addresses in "idempotency_redis" directive need "cluster" or "sentinel="



=== TEST 12: the Redis Cluster form passes with seed nodes and options
--- config
    location = /t {
        idempotency on;
        idempotency_redis 127.0.0.1:7000 127.0.0.1:7001 cluster db=0
                          password=secret prefix=t001: timeout=2s;
        return 200 "ok\n";
    }

    location = /one {
        idempotency_redis localhost:7000 cluster;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok



=== TEST 12a: Redis Cluster has no database but 0
--- config
    location = /t {
        idempotency_redis 127.0.0.1:7000 127.0.0.1:7001 cluster db=2;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: Redis Cluster has only database 0, "db=2" is not possible



=== TEST 12b: Redis Cluster nodes are not unix sockets
--- config
    location = /t {
        idempotency_redis 127.0.0.1:7000 unix:/tmp/t001.sock cluster;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: Redis Cluster nodes are TCP addresses, not "unix:/tmp/t001.sock"



=== TEST 12c: the cluster form needs a seed node
--- config
    location = /t {
        idempotency_redis cluster prefix=x:;
    }
--- must_die
--- error_log
[emerg]
no address in "idempotency_redis" directive



=== TEST 13: idempotency on without idempotency_redis is an error
--- config
    location = /t {
        idempotency on;
    }
--- must_die
--- error_log
[emerg]
"idempotency" is on but no "idempotency_redis" is defined for it



=== TEST 14: a bad on_store_error value is an error
--- config
    idempotency_on_store_error maybe;
--- must_die
--- error_log
[emerg]
invalid value "maybe" in "idempotency_on_store_error" directive



=== TEST 15: a bad size is an error
--- config
    idempotency_max_response_size 1x;
--- must_die
--- error_log
[emerg]
invalid size "1x" in "idempotency_max_response_size" directive



=== TEST 15a: a zero idempotency_max_response_size is an error
(it would answer every retry with 422 OVERSIZE)
--- config
    idempotency_max_response_size 0;
--- must_die
--- error_log
[emerg]
invalid size "0" in "idempotency_max_response_size" directive, 1 to 512m is expected



=== TEST 16: a bad status is an error
--- config
    idempotency_store_status 2xx 6xx;
--- must_die
--- error_log
[emerg]
invalid status "6xx" in "idempotency_store_status" directive



=== TEST 17: a header name that is not a token is an error
--- config
    idempotency_header "Idempotency Key";
--- must_die
--- error_log
[emerg]
invalid header name "Idempotency Key" in "idempotency_header" directive



=== TEST 18: a flag with a bad value is an error naming the directive
--- config
    idempotency yes;
--- must_die
--- error_log
[emerg]
invalid value "yes" in "idempotency" directive



=== TEST 19: a duplicate directive is an error
--- config
    idempotency_ttl 1h;
    idempotency_ttl 2h;
--- must_die
--- error_log
[emerg]
"idempotency_ttl" directive is duplicate



=== TEST 20: settings inherit from http to location
--- http_config
    idempotency on;
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT prefix=t001:;
    idempotency_required on;
--- config
    location = /t {
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "ran\n";
    }
--- request
POST /t
{"a":1}
--- error_code: 400
--- response_headers
Content-Type: application/problem+json
--- response_body_like chomp
"title":"Idempotency-Key is missing"



=== TEST 21: a location can switch it off again
--- http_config
    idempotency on;
    idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT prefix=t001:;
    idempotency_required on;
--- config
    location = /t {
        idempotency off;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "ran\n";
    }
--- request
POST /t
{"a":1}
--- response_body
ran



=== TEST 22: the header name is inherited from the server level
--- config
    idempotency_header X-Request-Key;
    idempotency_required on;
    location = /t {
        idempotency on;
        idempotency_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT prefix=t001:;
        proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend;
    }
    location = /backend {
        return 200 "ran\n";
    }
--- request
POST /t
{"a":1}
--- more_headers
Idempotency-Key: abc
--- error_code: 400
--- response_body_like chomp
"title":"Idempotency-Key is missing"



=== TEST 23: a key length limit out of range is an error
--- config
    idempotency_key_max_length 0;
--- must_die
--- error_log
[emerg]
invalid length "0" in "idempotency_key_max_length" directive



=== TEST 24: a problem type that cannot go into JSON is an error
--- config
    idempotency_problem_type "https://x/\"y";
--- must_die
--- error_log
[emerg]
in "idempotency_problem_type" directive



=== TEST 25: a header that is never replayed cannot be passed
--- config
    idempotency_pass_header Date;
--- must_die
--- error_log
[emerg]
"Date" in "idempotency_pass_header" directive: only a header hidden by default (Set-Cookie) can be passed; this one is never replayed



=== TEST 26: the Sentinel form: sentinels (port 26379 by default), a master name, options
--- config
    location = /t {
        idempotency on;
        idempotency_redis 127.0.0.1:26379 127.0.0.1:26380 127.0.0.1
                          sentinel=mymaster db=1 password=secret user=app
                          sentinel_password=s3cret sentinel_user=watcher
                          timeout=200ms connect_timeout=100ms prefix=t001:;
        return 200 "ok\n";
    }
    location = /one {
        idempotency on;
        idempotency_redis 127.0.0.1:26379 sentinel=other;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
--- no_error_log
[emerg]



=== TEST 27: a sentinel cannot be a unix socket
--- config
    location = /t {
        idempotency_redis 127.0.0.1:26379 unix:/tmp/s.sock sentinel=mymaster;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: sentinel "unix:/tmp/s.sock" must be a host:port, not a unix socket



=== TEST 28: the master name cannot be empty
--- config
    location = /t {
        idempotency_redis 127.0.0.1:26379 sentinel=;
    }
--- must_die
--- error_log
[emerg]
invalid option value "sentinel=" in "idempotency_redis" directive



=== TEST 29: sentinel= and cluster do not mix
--- config
    location = /t {
        idempotency_redis 127.0.0.1:26379 cluster sentinel=mymaster;
    }
--- must_die
--- error_log
[emerg]
"cluster" and "sentinel=" cannot be combined in "idempotency_redis" directive



=== TEST 30: sentinel_password= needs sentinel=
--- config
    location = /t {
        idempotency_redis 127.0.0.1:6379 sentinel_password=x;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: "sentinel_user=" and "sentinel_password=" need "sentinel="



=== TEST 31: sentinel_user= needs sentinel_password=
--- config
    location = /t {
        idempotency_redis 127.0.0.1:26379 sentinel=m sentinel_user=w;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: "sentinel_user=" needs "sentinel_password="



=== TEST 32: resolve does not apply to sentinels
--- config
    resolver 127.0.0.1;
    location = /t {
        idempotency_redis 127.0.0.1:26379 sentinel=mymaster resolve;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive: "resolve" is not possible with "sentinel="



=== TEST 33: resolve needs a resolver where the directive is
--- config
    location = /t {
        idempotency on;
        idempotency_redis redis.invalid:6379 resolve;
    }
--- must_die
--- error_log
[emerg]
"idempotency_redis" directive with "resolve" needs a "resolver" where it is ("redis.invalid:6379")



=== TEST 34: with resolve, a name is not resolved when the configuration is read
--- config
    resolver 127.0.0.1:1 valid=1s;
    location = /t {
        idempotency on;
        idempotency_redis redis.invalid:6379 resolve;
        return 200 "ok\n";
    }
--- request
GET /t
--- response_body
ok
--- no_error_log
[emerg]



=== TEST 35: errors found after the http block name the Redis directive's place: resolve without a resolver, used or not; a missing CA file
--- init
main::refused_at('resolve in a location', <<'HTTP',
    server {
        listen 127.0.0.1:1;

        location = /t {
            idempotency on;
            idempotency_redis redis.invalid:6379 resolve;
        }
    }
HTTP
    'idempotency_redis redis.invalid:6379 resolve;',
    qr/"idempotency_redis" directive with "resolve" needs a "resolver"/);

# no location uses it: it is refused all the same (where it is, a resolver
# is needed; nginx -t cannot know that no location will)
main::refused_at('resolve in http, used by no location', <<'HTTP',
    idempotency_redis redis.invalid:6379
                      resolve;

    server {
        listen 127.0.0.1:1;

        location = /t {
            return 204;
        }
    }
HTTP
    'resolve;',
    qr/"idempotency_redis" directive with "resolve" needs a "resolver"/);

SKIP: {
    my $nginx = $ENV{TEST_NGINX_BINARY} || 'nginx';
    Test::More::skip('nginx without OpenSSL: "tls" is refused', 2)
        if `'$nginx' -V 2>&1` !~ /OpenSSL/;

    main::refused_at('a missing tls_trusted_certificate file', <<'HTTP',
    server {
        listen 127.0.0.1:1;

        location = /t {
            idempotency on;
            idempotency_redis 127.0.0.1:6379 tls
                              tls_trusted_certificate=/nonexistent/ca.crt;
        }
    }
HTTP
        'tls_trusted_certificate=/nonexistent/ca.crt;',
        qr{"idempotency_redis" directive: cannot load "tls_trusted_certificate=/nonexistent/ca\.crt"});
}
--- config
    location = /t {
        return 204;
    }
--- request
GET /t
--- error_code: 204



=== TEST 36: errors found after the http block name the location directive's place: idempotency on or idempotency_admin without Redis, an undeclared cache zone
--- init
main::refused_at('idempotency on without idempotency_redis', <<'HTTP',
    server {
        listen 127.0.0.1:1;

        location = /t {
            idempotency on;
            return 204;
        }
    }
HTTP
    'idempotency on;',
    qr/"idempotency" is on but no "idempotency_redis" is defined for it/);

# inherited from the server: the place of the server's directive
main::refused_at('idempotency on inherited without idempotency_redis',
                 <<'HTTP',
    server {
        listen 127.0.0.1:1;
        idempotency on;

        location = /t {
            return 204;
        }
    }
HTTP
    'idempotency on;',
    qr/"idempotency" is on but no "idempotency_redis" is defined for it/);

main::refused_at('idempotency_admin without idempotency_redis', <<'HTTP',
    server {
        listen 127.0.0.1:1;

        location = /admin {
            idempotency on;
            idempotency_admin;
        }
    }
HTTP
    'idempotency_admin;',
    qr/"idempotency_admin" needs an "idempotency_redis" for its location/);

main::refused_at('idempotency_cache of an undeclared zone', <<'HTTP',
    idempotency_redis 127.0.0.1:6379;
    idempotency_cache_zone declared:1m;

    server {
        listen 127.0.0.1:1;

        location = /t {
            idempotency on;
            idempotency_cache nozone;
        }
    }
HTTP
    'idempotency_cache nozone;',
    qr/"idempotency_cache" directive: zone "nozone" is not declared by "idempotency_cache_zone"/);
--- config
    location = /t {
        return 204;
    }
--- request
GET /t
--- error_code: 204
