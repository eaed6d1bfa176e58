# ngx_http_idempotency_module: build, run and test.  `make help` lists targets.
# Recipes stay short; the logic lives in scripts/*.sh.

NGINX_SRC     ?= /usr/share/nginx/src
NGINX_BIN     ?= /usr/sbin/nginx
CC_OPT        ?=
LD_OPT        ?=
PORT          ?= 8080
UPSTREAM_PORT ?= 8081
REDIS_PORT    ?= 6390
TESTS         ?=
PROVE_FLAGS   ?=
FUZZ_SECONDS  ?= 60
# NGINX_VERSION=1.30.4: build that nginx (binary and module) from
# SHARED_DIR/nginx/nginx-1.30.4.tar.gz in build/nginx-1.30.4/ and test with it.
# HIREDIS=1.4.1: build hiredis from SHARED_DIR/hiredis/ into build/hiredis-1.4.1/
# and the module against it (HIREDIS_INC/HIREDIS_LIB, as config reads them).
NGINX_VERSION ?=
HIREDIS       ?=
# REDIS=6.0.20 (6.2.16, 7.2.6, valkey-8.0.1): the tests run that server,
# built once from SHARED_DIR/redis/ into build/redis/<name>/ (by
# scripts/redis-servers.sh) and put first on PATH; default: Debian's
REDIS         ?=
SHARED_DIR    ?= $(abspath $(CURDIR)/..)/shared
# Test::Nginx to run the suite with (a lib/ directory): by default the one
# Perl finds, else the bundled t/runner; TEST_NGINX_LIB=shared uses the copy
# in SHARED_DIR/test-nginx/, extracted into build/test-nginx/.
TEST_NGINX_LIB ?=

# build directory: one per nginx version and hiredis, so that the default
# build (Debian's nginx in build/) is never reconfigured by another one
B := build
ifneq ($(NGINX_VERSION),)
B := build/nginx-$(NGINX_VERSION)
NGINX_SRC := $(CURDIR)/build/src/nginx-$(NGINX_VERSION)
endif
ifneq ($(HIREDIS),)
B := $(B)/with-hiredis-$(HIREDIS)
HIREDIS_INC := $(CURDIR)/build/hiredis-$(HIREDIS)/include
HIREDIS_LIB := $(CURDIR)/build/hiredis-$(HIREDIS)/lib
endif
ifneq ($(NGINX_VERSION),)
NGINX_BIN := $(CURDIR)/$(B)/objs/nginx
endif
BUILD_DIR := $(CURDIR)/$(B)
NGINX_BINARY := $(if $(filter build-module,$(MAKECMDGOALS)),no,yes)

export NGINX_SRC NGINX_BIN CC_OPT LD_OPT PORT UPSTREAM_PORT REDIS_PORT \
       TESTS PROVE_FLAGS FUZZ_SECONDS NGINX_VERSION HIREDIS REDIS SHARED_DIR \
       HIREDIS_INC HIREDIS_LIB BUILD_DIR TEST_NGINX_LIB NGINX_BINARY

MODULE := $(B)/ngx_http_idempotency_module.so

# Packages scripts/setup.sh checks for (and installs) before anything is
# built: what the requested goals need, so a fresh machine runs apt once.
SETUP_SET := build
ifneq ($(filter run,$(MAKECMDGOALS)),)
SETUP_SET := run
endif
ifneq ($(filter test,$(MAKECMDGOALS)),)
SETUP_SET := test
endif
ifneq ($(filter test-asan,$(MAKECMDGOALS)),)
SETUP_SET := asan
endif
ifneq ($(filter bench,$(MAKECMDGOALS)),)
SETUP_SET := bench
endif
ifneq ($(filter deb test-deb,$(MAKECMDGOALS)),)
SETUP_SET := deb
endif
ifneq ($(filter lint,$(MAKECMDGOALS)),)
SETUP_SET := lint
endif
ifneq ($(filter test-valgrind setup,$(MAKECMDGOALS)),)
SETUP_SET := all
endif

.DEFAULT_GOAL := build
.PHONY: build build-module setup check-load check-example check-src \
        run stop test test-valgrind test-asan fuzz lint deb test-deb docs \
        clean help FORCE

build: check-load

# the module only: with NGINX_VERSION, nginx itself is not built (a compile
# check against that version's tree, as CI does for the versions it does
# not run the suites on)
build-module: $(MODULE)

check-load: $(MODULE)
	@scripts/build.sh check-load

# nginx's own Makefile knows when a .c or .h changed: always ask it
# ('+': it is a sub-make and shares our -j).
$(MODULE): $(B)/objs/Makefile FORCE
	+@scripts/build.sh module

# configure again only when config, the Lua scripts or the nginx tree change
# (config turns src/lua/*.lua into a C header at configure time).
$(B)/objs/Makefile: config $(wildcard src/lua/*.lua) $(B)/nginx.sig
	@scripts/build.sh configure

$(B)/nginx.sig: FORCE | setup
	@scripts/build.sh signature

setup:
	@scripts/setup.sh $(SETUP_SET)

check-example: build
	@scripts/run.sh --check

check-src:
	@scripts/build.sh check-src

run: build
	@scripts/run.sh

stop:
	@scripts/stop.sh

test: build check-example
	@scripts/test.sh

test-valgrind: build check-example
	@scripts/test.sh --valgrind

# builds its own ASan copy of the module in build/asan/ (make -C there)
test-asan: setup
	@scripts/test-asan.sh

fuzz: build
	@scripts/setup.sh fuzz
	@scripts/fuzz.sh

lint: build
	@scripts/lint.sh

# REDIS_SERVERS="6.0.20 valkey-8.0.1": build those servers in build/redis/
REDIS_SERVERS ?= 6.0.20 6.2.16 7.2.6 valkey-8.0.1
.PHONY: redis-servers
redis-servers:
	@scripts/redis-servers.sh $(REDIS_SERVERS)

# the Debian package, built in build/deb/ (debian/, dh_nginx)
deb: setup
	@scripts/deb.sh

# builds the package, installs it (as root), nginx -t, purges it again
test-deb: setup
	@prove pkg-test/

# re-render docs/diagrams/*.svg from their .dot sources
docs:
	@scripts/setup.sh docs
	@scripts/docs.sh

# BENCH_ARGS: options of bench/bench.sh, e.g. make bench BENCH_ARGS=--quick
.PHONY: bench
bench: build
	@bench/bench.sh $(BENCH_ARGS)

clean:
	@scripts/stop.sh --quiet
	rm -rf build t/servroot*

help:
	@echo 'make [build]        build build/ngx_http_idempotency_module.so and check it loads'
	@echo '                    (NGINX_SRC=/path/to/nginx-1.22.1 for a plain source tree)'
	@echo 'make build-module   the module only (with NGINX_VERSION: not nginx itself)'
	@echo 'make setup          install the Debian packages everything needs (as root)'
	@echo 'make run            demo: redis + nginx with examples/nginx.conf on'
	@echo '                    127.0.0.1:$$PORT (8080); Ctrl-C or make stop ends it'
	@echo 'make stop           stop what make run started'
	@echo 'make test           unit tests (t/unit) and prove t/*.t; TESTS=t/x.t for a subset'
	@echo '    NGINX_VERSION=1.30.4  ... with that nginx built from ../shared/nginx/'
	@echo '                    in build/nginx-1.30.4/ (also for make build)'
	@echo '    HIREDIS=1.4.1   ... with the module built against that hiredis'
	@echo '    TEST_NGINX_LIB=shared  ... under the real Test::Nginx in ../shared'
	@echo '    REDIS=6.0.20    ... against that Redis (6.2.16, 7.2.6, valkey-8.0.1),'
	@echo '                    built once from ../shared/redis/ in build/redis/'
	@echo 'make test-valgrind  the same with nginx under valgrind memcheck'
	@echo 'make test-asan      the same with the module built with AddressSanitizer'
	@echo '                    (in build/asan/) and nginx under LD_PRELOAD=libasan'
	@echo 'make redis-servers  build the servers of the matrix in build/redis/'
	@echo 'make fuzz           libFuzzer on the key, stored-record and claim-reply'
	@echo '                    parsers, FUZZ_SECONDS (60) each; fails on a crash'
	@echo 'make lint           style (80 columns, tabs, trailing space, //), cppcheck'
	@echo '                    and clang-tidy over src/'
	@echo 'make deb            build/deb/libnginx-mod-http-idempotency_VERSION_ARCH.deb'
	@echo 'make test-deb       build the .deb, install it, nginx -t, purge it (root)'
	@echo 'make docs           render docs/diagrams/*.dot to SVG (graphviz)'
	@echo 'make bench          throughput/latency vs nginx alone, proxy_pass, srcache'
	@echo '                    and a Lua peer (~3 min; BENCH_ARGS=--quick: ~1.5 min)'
	@echo 'make check-example  nginx -t on the rendered examples/nginx.conf'
	@echo 'make check-src      verify the nginx-dev tree is unmodified, every'
	@echo '                    src/*.c includes nginx'"'"'s or the module'"'"'s header first,'
	@echo '                    the layers hold (scripts/callgraph.sh), and the'
	@echo '                    fuzz targets build (clang; make fuzz runs them)'
	@echo 'make clean          stop the demo, remove build/'

FORCE:
