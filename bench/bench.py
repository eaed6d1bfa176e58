#!/usr/bin/env python3
"""Throughput and latency of ngx_http_idempotency_module next to its ceiling,
its baseline and two peers, in one bounded run on 127.0.0.1.

It starts everything itself (and stops it again, by pid, also on Ctrl-C):
  * a private redis-server and memcached;
  * the "trivial upstream": an nginx (1 worker) answering the ~1 KiB JSON
    (64 KiB and 1 MiB bodies for the scaling runs);
  * one front nginx per subject, each with only its own modules loaded:
      ceiling   `return 200` with the same JSON, from memory
      plain     proxy_pass to the upstream (the baseline)
      module    idempotency on + proxy_pass          (MISS / HIT)
      srcache   srcache_fetch/store + memc, memcached (MISS / HIT)
      lua       lua-nginx-module + lua-resty-redis (bench/lua/idem_peer.lua)
and drives each with wrk (bench/wrk.lua): POST, ~1 KiB JSON body, keep-alive,
a fixed number of connections. MISS scenarios send a new Idempotency-Key per
request; HIT scenarios replay a pre-stored set of keys round-robin.

It prints requests/s, p50/p99 latency and CPU time per request of each
process, the ratios against the targets of issues #6 and #14, Redis INFO commandstats
deltas per request, CLIENT LIST during a module run, worker RSS before and
after, added p99 under a moderate (rate-limited) load, and the response size
scaling. Results also go to build/bench/results.{md,json}.

    bench/bench.sh                      # the whole table, ~3 minutes
    bench/bench.sh --quick              # 3 s per scenario, ~1 minute
    bench/bench.sh --only hit,baseline --duration 20
    bench/bench.sh --soak 1000000       # RSS of the module's workers over 1M requests
    bench/bench.sh --profile            # callgrind instruction counts per request

Python 3 standard library, plus Debian's wrk, nginx, redis-server, memcached,
libnginx-mod-http-{srcache-filter,memc,lua,ndk}, lua-nginx-redis, valgrind
(`scripts/setup.sh bench` installs them).
"""

import argparse
import ctypes
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
MODDIR = "/usr/lib/nginx/modules"
CLK_TCK = os.sysconf("SC_CLK_TCK")

SIZES = {"1k": 1024, "64k": 64 * 1024, "1m": 1024 * 1024}
# the "large records" section: stored and replayed beside small requests
LARGE = {"10m": 10 * 1024 * 1024, "60m": 60 * 1024 * 1024}

TARGETS = [
    # name, numerator, denominator, minimum ratio
    ("HIT / srcache+memc HIT", "hit", "srcache-hit", 1.15),
    ("HIT / Lua peer HIT", "hit", "lua-hit", 1.4),
    ("HIT / plain proxy_pass", "hit", "baseline", 1.0),
    ("MISS / srcache+memc MISS", "miss", "srcache-miss", 1.3),
    ("MISS / Lua peer MISS", "miss", "lua-miss", 3.0),
    # issue 14 raised these two (0.55 before; the ceiling had none)
    ("MISS / plain proxy_pass", "miss", "baseline", 0.65),
    ("HIT / ceiling", "hit", "ceiling", 0.7),
    # issue 25: a replay from the node's cache (idempotency_cache)
    ("cached HIT / ceiling", "cache-hit", "ceiling", 0.85),
    # issue 34: claims and records acknowledged by a replica on the same
    # machine (wait_replicas=1), against the same MISS without
    ("MISS wait_replicas=1 / MISS", "miss-wait", "miss", 0.8),
]

# name -> (subject, key mode)
SCENARIOS = {
    "ceiling": ("ceiling", "cycle"),
    "baseline": ("plain", "cycle"),
    "miss": ("module", "unique"),
    "miss-wait": ("module", "unique"),
    "hit": ("module", "cycle"),
    "cache-hit": ("module", "cycle"),
    "srcache-miss": ("srcache", "unique"),
    "srcache-hit": ("srcache", "cycle"),
    "lua-miss": ("lua", "unique"),
    "lua-hit": ("lua", "cycle"),
}
# the location a scenario uses, when not /orders
PATHS = {"cache-hit": "/cached/orders", "miss-wait": "/wait/orders"}
ORDER = ["ceiling", "baseline", "miss", "miss-wait", "hit", "cache-hit",
         "srcache-miss",
         "srcache-hit", "lua-miss", "lua-hit"]


class SetupError(Exception):
    pass


class Interrupted(BaseException):
    pass


def log(*args):
    print(*args, flush=True)


# --------------------------------------------------------------------------
# processes

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # PR_SET_PDEATHSIG: if this script is killed, its children go too
    _libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, seconds, proc):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def proc_stat(pid):
    """(ppid, cpu seconds, rss bytes) of pid, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    ppid = int(fields[1])
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return ppid, cpu, rss


def vm_rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st and st[0] == pid:
                out.append(int(d))
    return sorted(out)


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")
                    if a]
    except OSError:
        return []


class Service:
    """One process started and stopped by pid."""

    def __init__(self, name, argv, logfile, stop_signal=signal.SIGTERM):
        self.name, self.argv, self.logfile = name, argv, logfile
        self.stop_signal = stop_signal
        self.stop_grace = 10
        self.proc = None
        self.children = []

    def start(self, port=None, seconds=30):
        out = open(self.logfile, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        out.close()
        if port and not wait_port(port, seconds, self.proc):
            self.stop()
            raise SetupError("%s did not start (see %s)"
                             % (self.name, self.logfile))
        return self

    @property
    def pid(self):
        return self.proc.pid

    def pids(self):
        """The processes doing the work: the workers of an nginx master."""
        return self.children or [self.proc.pid]

    def stop(self):
        if not self.proc:
            return
        kids = children_of(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                # under valgrind, writing the profile out takes a while
                self.proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in kids + self.children:
            for _ in range(100):
                if not proc_stat(pid):
                    break
                time.sleep(0.05)
            else:
                if "nginx" in " ".join(cmdline(pid)):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        self.proc = None


class Nginx(Service):
    def __init__(self, name, workdir, conf, workers):
        self.dir = os.path.join(workdir, name)
        for sub in ("logs", "tmp", "html"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.workers = workers
        super().__init__(name, [NGINX, "-p", self.dir + "/", "-c", self.conf,
                                "-e", os.path.join(self.dir, "logs/error.log"),
                                "-g", "daemon off;"],
                         os.path.join(self.dir, "logs/stderr.log"),
                         signal.SIGTERM)

    def test(self):
        r = subprocess.run(self.argv[:-2] + ["-t", "-q"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode:
            raise SetupError("nginx -t (%s): %s"
                             % (self.name, r.stdout.decode(errors="replace")))

    def start(self, port=None, seconds=30):
        self.test()
        super().start(port, seconds)
        end = time.monotonic() + seconds
        while True:
            self.children = [p for p in children_of(self.proc.pid)
                             if "worker" in " ".join(cmdline(p))]
            if len(self.children) >= self.workers:
                break
            if time.monotonic() > end:
                self.stop()
                raise SetupError("nginx %s: workers did not start" % self.name)
            time.sleep(0.05)
        return self

    def errors(self):
        path = os.path.join(self.dir, "logs/error.log")
        try:
            with open(path, errors="replace") as f:
                return [l.rstrip() for l in f
                        if re.search(r"\[(warn|error|crit|alert|emerg)\]", l)]
        except OSError:
            return []


# --------------------------------------------------------------------------
# Redis and memcached, spoken to directly

class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), 5)
        self.f = self.sock.makefile("rb")

    def close(self):
        self.f.close()
        self.sock.close()

    def __call__(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise SetupError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise SetupError("redis: bad reply %r" % line)

    def info(self, section):
        text = self("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def commandstats(self):
        out = {}
        for k, v in self.info("commandstats").items():
            if k.startswith("cmdstat_"):
                d = dict(x.split("=") for x in v.split(","))
                out[k[8:]] = {"calls": int(d["calls"]),
                              "usec": int(d["usec"])}
        return out


def memcached_stats(port):
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(b"stats\r\n")
    data = b""
    while not data.endswith(b"END\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    out = {}
    for line in data.decode().splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == "STAT":
            try:
                out[p[1]] = int(p[2])
            except ValueError:
                pass
    return out


def socket_owners(pids):
    """socket inode -> pid, for the sockets that pids hold."""
    inode_pid = {}
    for pid in pids:
        d = "/proc/%d/fd" % pid
        try:
            for fd in os.listdir(d):
                try:
                    t = os.readlink(os.path.join(d, fd))
                except OSError:
                    continue
                if t.startswith("socket:["):
                    inode_pid[t[8:-1]] = pid
        except OSError:
            pass
    return inode_pid


def tcp_sockets():
    """(local port, state, inode) of the machine's IPv4 TCP sockets."""
    with open("/proc/net/tcp") as f:
        next(f)
        return [(int(p[1].split(":")[1], 16), p[3], p[9])
                for p in (line.split() for line in f)]


def client_sockets(pids):
    """local TCP port -> pid, for the sockets that pids hold."""
    owners = socket_owners(pids)
    return {port: owners[ino] for port, _, ino in tcp_sockets()
            if ino in owners}


def conn_split(port, pids):
    """How many of the established connections to port each of pids holds
    (wrk's connections stay where the kernel put them for the whole run:
    an uneven split leaves one front worker short of work)."""
    owners = socket_owners(pids)
    counts = dict.fromkeys(pids, 0)
    for lport, state, ino in tcp_sockets():
        if lport == port and state == "01" and ino in owners:
            counts[owners[ino]] += 1
    return [counts[pid] for pid in pids]


def fmt_split(split):
    """conn_split()'s counts as "12/20", or "" when not counted."""
    return "/".join(map(str, sorted(split or [])))


# --------------------------------------------------------------------------
# bodies and configurations

def json_body(size, tag):
    """Deterministic JSON of exactly size bytes."""
    head = '{"id":"%s","currency":"EUR","items":[' % tag
    items, n, length = [], 0, len(head)
    while length < size - 200:
        items.append('{"sku":"SKU-%06d","qty":%d,"price":%d}'
                     % (n * 7919 % 999983, n % 9 + 1, n * 131 % 10007))
        length += len(items[-1]) + 1
        n += 1
    text = head + ",".join(items) + '],"note":"'
    text += "x" * (size - len(text) - 2) + '"}'
    assert len(text) == size
    return text


def common_http(opts, extra=""):
    return """
worker_processes %d;
pid nginx.pid;
events {
    worker_connections 8192;
}
http {
    access_log off;
    default_type application/json;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;

    upstream app {
        server 127.0.0.1:%d;
        keepalive 128;
        keepalive_requests 100000000;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffers 16 16k;
    proxy_max_temp_file_size 0;
%s
""" % (opts.workers, opts.upstream_port, extra)


def subject_conf(subject, opts, port):
    listen = "listen 127.0.0.1:%d reuseport backlog=4096;" % port
    if subject == "ceiling":
        return ("" + common_http(opts) + """
    server {
        %s
        location / {
            return 200 '%s';
        }
    }
}
""" % (listen, RESPONSE_1K))
    if subject == "plain":
        return common_http(opts) + """
    server {
        %s
        location / {
            proxy_pass http://app;
        }
    }
}
""" % listen
    if subject == "module":
        return ("load_module %s;\n" % opts.module) + common_http(opts, """
    idempotency_redis 127.0.0.1:%d prefix=bench:;
    idempotency_cache_zone bench:64m;
""" % opts.redis_port) + """
    server {
        %s
        location / {
            idempotency on;
            # the load generator sends no credentials: one deliberate
            # shared namespace (an empty scope would be refused)
            idempotency_scope bench;
            idempotency_ttl 1h;
            idempotency_max_response_size 2m;
            proxy_pass http://app;
        }
        # the same, replayed from the node's cache (cache-hit)
        location /cached/ {
            idempotency on;
            idempotency_scope bench;
            idempotency_ttl 1h;
            idempotency_cache bench;
            proxy_pass http://app/;
        }
        # the same with its claims and records acknowledged by a replica
        # (miss-wait)
        location /wait/ {
            idempotency on;
            idempotency_scope bench;
            idempotency_ttl 1h;
            idempotency_redis 127.0.0.1:%d prefix=bench:wait:
                              wait_replicas=1;
            proxy_pass http://app/;
        }
        # the "large records" runs: 10 MB and 60 MB responses
        location /large/ {
            idempotency on;
            idempotency_ttl 1h;
            idempotency_max_response_size 100m;
            proxy_pass http://app/orders/;
        }
    }
}
""" % (listen, opts.redis_port)
    if subject == "srcache":
        return ("load_module %s/ngx_http_srcache_filter_module.so;\n"
                "load_module %s/ngx_http_memc_module.so;\n" % (MODDIR, MODDIR)
                + common_http(opts, """
    upstream memc {
        server 127.0.0.1:%d;
        keepalive 128;
    }
""" % opts.memcached_port) + """
    server {
        %s
        location = /memc {
            internal;
            client_max_body_size 4m;
            memc_connect_timeout 1s;
            memc_send_timeout 1s;
            memc_read_timeout 1s;
            set $memc_key $query_string;
            set $memc_exptime 3600;
            memc_pass memc;
        }
        location / {
            srcache_methods POST;
            srcache_fetch GET /memc $http_idempotency_key;
            srcache_store PUT /memc $http_idempotency_key;
            srcache_store_statuses 200 201;
            proxy_pass http://app;
        }
    }
}
""" % listen)
    if subject == "lua":
        return ("load_module %s/ndk_http_module.so;\n"
                "load_module %s/ngx_http_lua_module.so;\n" % (MODDIR, MODDIR)
                + common_http(opts, """
    lua_package_path "%s/lua/?.lua;/usr/share/lua/5.1/?.lua;;";
    init_by_lua_block {
        require("idem_peer").configure{ redis_port = %d }
    }
""" % (BENCH, opts.redis_port)) + """
    server {
        %s
        location / {
            access_by_lua_block        { require("idem_peer").access() }
            header_filter_by_lua_block { require("idem_peer").header() }
            body_filter_by_lua_block   { require("idem_peer").body() }
            log_by_lua_block           { require("idem_peer").log() }
            proxy_pass http://app;
        }
    }
}
""" % listen)
    raise ValueError(subject)


def upstream_conf(opts):
    return """
worker_processes 1;
pid nginx.pid;
events {
    worker_connections 8192;
}
http {
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    types {
        application/json json;
    }
    default_type application/json;
    server {
        listen 127.0.0.1:%d backlog=4096;
        # the ~1 KiB JSON, from memory
        location = /orders {
            return 200 '%s';
        }
        # 64 KiB and 1 MiB: files; a POST to a file is 405 for the static
        # module, error_page turns it into a GET of the same file
        location /orders/ {
            root html;
            error_page 405 =200 $uri;
        }
    }
}
""" % (opts.upstream_port, RESPONSE_1K)


# --------------------------------------------------------------------------
# HTTP checks and pre-storing keys

def post(conn, path, key, body=None):
    headers = {"Content-Type": "application/json",
               "Authorization": "Bearer bench-client"}
    if key is not None:
        headers["Idempotency-Key"] = key
    conn.request("POST", path, body=REQUEST_BODY if body is None else body,
                 headers=headers)
    r = conn.getresponse()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()


def prestore(port, path, runid, keys, expect):
    """POST each of keys keys once, so that they are stored, and check the
    second request of the first key is a replay of the expected body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for n in range(keys):
            st, _, body = post(conn, path, "%s-%d" % (runid, n))
            if st != 200 or body != expect:
                raise SetupError("pre-store %s %s-%d: %d, %d bytes"
                                 % (path, runid, n, st, len(body)))
        st, hdrs, body = post(conn, path, "%s-0" % runid)
        if st != 200 or body != expect:
            raise SetupError("replay %s: %d, %d bytes (expected %d)"
                             % (path, st, len(body), len(expect)))
        return hdrs.get("idempotent-replayed")
    finally:
        conn.close()


def check_subject(subject, port):
    """One request (two for the stores) to see the subject answers right."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        key = "check-%d" % random.randrange(1 << 30)
        st, hdrs, body = post(conn, "/orders", key)
        if st != 200 or body != RESPONSE_1K.encode():
            raise SetupError("%s answers %d with %d bytes" % (subject, st,
                                                              len(body)))
        if subject in ("module", "lua", "srcache"):
            time.sleep(0.05)        # the Lua peer stores from a timer
            st, hdrs, body = post(conn, "/orders", key)
            if st != 200 or body != RESPONSE_1K.encode():
                raise SetupError("%s replay: %d with %d bytes"
                                 % (subject, st, len(body)))
            if subject != "srcache" and hdrs.get("idempotent-replayed") \
                    != "true":
                raise SetupError("%s: second request was not replayed"
                                 % subject)
    finally:
        conn.close()


# --------------------------------------------------------------------------
# the machine: others' test suites share it

def busy_processes():
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        argv = cmdline(int(d))
        names = [os.path.basename(a) for a in argv[:3]]
        if "prove" in names or any(a.endswith("storm.py") for a in argv[:3]):
            out.append("%s (pid %s)" % (" ".join(names[:2]), d))
    return out


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st:
                kids.setdefault(st[0], []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def others_load(seconds=0.5):
    """Share of the machine (%) that processes other than this one and its
    children use, over seconds."""
    mine = descendants(os.getpid())
    c0 = sum((proc_stat(p) or (0, 0, 0))[1] for p in mine)
    t0, i0, q0 = cpu_totals()
    time.sleep(seconds)
    c1 = sum((proc_stat(p) or (0, 0, 0))[1] for p in mine)
    t1, i1, q1 = cpu_totals()
    busy = (t1 - t0) - (i1 - i0) - (c1 - c0)
    return max(0.0, 100 * busy / ((t1 - t0) or 1))


def wait_idle(opts):
    """Waits (bounded by --idle-wait) while a prove or storm.py runs or
    other processes keep more than --max-others % of the machine busy;
    returns what was still running when it gave up, or []."""
    end = time.monotonic() + opts.idle_wait
    said = False
    while True:
        busy = busy_processes()
        if not busy:
            load = others_load()
            if load > opts.max_others:
                busy = ["other processes (%.0f%% of the machine)" % load]
        if not busy or time.monotonic() >= end:
            if busy:
                log("  ! still busy after %ds, measuring anyway: %s"
                    % (opts.idle_wait, ", ".join(busy)))
            return busy
        if not said:
            log("  waiting (up to %ds) for %s to finish"
                % (opts.idle_wait, ", ".join(busy)))
            said = True
        time.sleep(2)


def cpu_totals():
    """(all, idle, irq + softirq) CPU seconds of the machine so far."""
    with open("/proc/stat") as f:
        p = f.readline().split()
    vals = [int(x) for x in p[1:]]
    return (sum(vals[:8]) / CLK_TCK, (vals[3] + vals[4]) / CLK_TCK,
            (vals[5] + vals[6]) / CLK_TCK)


# --------------------------------------------------------------------------
# one wrk run

def prepare(name, port, path, runid, keys, size="1k"):
    """Stores the keys a "cycle" scenario replays (nothing for a subject
    that stores nothing), and checks the module and the Lua peer replay."""
    subject = SCENARIOS[name][0]
    if subject not in ("module", "lua", "srcache"):
        return
    replayed = prestore(port, path, runid, keys, RESPONSES[size].encode())
    if subject != "srcache" and replayed != "true":
        raise SetupError("%s: pre-stored key not replayed" % name)
    if subject == "lua":
        time.sleep(0.1)


def cpu_per_request(res, apart=()):
    """CPU seconds of the bench's processes per request, leaving out the
    process groups in apart. The processes' time already includes the
    softirq work done in their context: irq is not added again."""
    n = res["requests"] or 1
    return sum(v for k, v in res["cpu"].items() if k not in apart) / n


def run_wrk(opts, port, mode, runid, duration, path="/orders", keys=None,
            delay_ms=0, connections=None, procs=None, sample=None):
    """Runs wrk, returns its RESULT dict plus cpu seconds per process group
    (procs: name -> [pids]) over the run."""
    argv = ["wrk", "-t", str(opts.threads),
            "-c", str(connections or opts.connections),
            "-d", "%ds" % max(1, round(duration)), "--timeout", "5s",
            "-s", os.path.join(BENCH, "wrk.lua"),
            "http://127.0.0.1:%d%s" % (port, path), "--",
            mode, str(keys or opts.keys), runid, BODY_FILE, str(delay_ms)]
    procs = procs or {}

    def cpu(pids):
        return sum((proc_stat(p) or (0, 0, 0))[1] for p in pids)

    before = {k: cpu(v) for k, v in procs.items()}
    tot0, idle0, irq0 = cpu_totals()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    sampled = None
    split = None
    try:
        if sample or procs.get("nginx"):
            time.sleep(duration / 2)
        if sample:
            sampled = sample()
        if procs.get("nginx"):
            split = conn_split(port, procs["nginx"])
        out_f = p.stdout.read()
        err_f = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    except BaseException:
        p.kill()
        p.wait()
        raise
    tot1, idle1, irq1 = cpu_totals()
    after = {k: cpu(v) for k, v in procs.items()}
    out, err = out_f.decode(errors="replace"), err_f.decode(errors="replace")
    m = re.search(r"^RESULT (.*)$", out, re.M)
    if p.returncode or not m:
        raise SetupError("wrk failed (%d): %s %s" % (p.returncode, out, err))
    res = {k: float(v) for k, v in (x.split("=") for x in m.group(1).split())}
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    res["errors"] = int(res["connect"] + res["read"] + res["write"]
                        + res["status"] + res["timeout"])
    res["cpu"] = {k: after[k] - before[k] for k in procs}
    res["cpu"]["wrk"] = ru.ru_utime + ru.ru_stime
    busy = (tot1 - tot0) - (idle1 - idle0)
    res["cpu_all"] = busy
    res["cpu_irq"] = irq1 - irq0
    # everything else that ran on the machine meanwhile (others' tests)
    # (the processes' system time already contains the softirq work done
    # in their context, so irq is not subtracted)
    res["cpu_other"] = max(0.0, busy - sum(res["cpu"].values()))
    res["wall"] = res["duration_us"] / 1e6
    res["sample"] = sampled
    res["split"] = split
    return res


# --------------------------------------------------------------------------
# the run

class Bench:
    def __init__(self, opts):
        self.o = opts
        self.services = []
        self.results = {}
        self.runs = {}
        self.rep = 0
        self.extra = {}
        self.notes = []

    def start(self, svc, port=None):
        self.services.append(svc)
        svc.start(port)
        return svc

    def stop(self, svc):
        svc.stop()
        if svc in self.services:
            self.services.remove(svc)

    def stop_all(self):
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception as e:     # keep stopping the others
                log("stopping %s: %s" % (svc.name, e))
        self.services = []

    # --- shared back ends
    def start_backends(self):
        o = self.o
        o.redis_port, o.memcached_port, o.upstream_port = \
            free_port(), free_port(), free_port()
        rdir = os.path.join(o.workdir, "redis")
        os.makedirs(rdir, exist_ok=True)
        self.redis = self.start(Service(
            "redis-server",
            ["redis-server", "--bind", "127.0.0.1", "--port",
             str(o.redis_port), "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", rdir,
             "--logfile", os.path.join(rdir, "redis.log")],
            os.path.join(rdir, "stdout.log")), o.redis_port)
        # a replica of it on the same machine, for miss-wait
        if "miss-wait" in o.scenarios:
            o.replica_port = free_port()
            self.start(Service(
                "redis-replica",
                ["redis-server", "--bind", "127.0.0.1", "--port",
                 str(o.replica_port), "--save", "", "--appendonly", "no",
                 "--daemonize", "no", "--dir", rdir,
                 "--replicaof", "127.0.0.1", str(o.redis_port),
                 "--logfile", os.path.join(rdir, "replica.log")],
                os.path.join(rdir, "replica-stdout.log")), o.replica_port)
        self.memcached = None
        if any(SCENARIOS[s][0] == "srcache" for s in o.scenarios):
            self.memcached = self.start(Service(
                "memcached",
                ["memcached", "-l", "127.0.0.1", "-p", str(o.memcached_port),
                 "-U", "0", "-t", "2", "-m", "2048", "-I", "2m", "-c", "4096"]
                + (["-u", "nobody"] if os.getuid() == 0 else []),
                os.path.join(o.workdir, "memcached.log")), o.memcached_port)
        self.r = Redis(o.redis_port)
        up = Nginx("upstream", o.workdir, upstream_conf(o), 1)
        html = os.path.join(up.dir, "html", "orders")
        os.makedirs(html, exist_ok=True)
        for name, size in SIZES.items():
            with open(os.path.join(html, name), "w") as f:
                f.write(RESPONSES[name])
        if o.large:
            for name, size in LARGE.items():
                with open(os.path.join(html, name), "wb") as f:
                    for i in range(size // (1 << 20)):
                        f.write((b"%08d" % i) * ((1 << 20) // 8))
        self.upstream = self.start(up, o.upstream_port)

    def procs(self, front, store):
        d = {"nginx": front.pids(), "upstream": self.upstream.pids()}
        if store == "redis":
            d["redis"] = [self.redis.pid]
        elif store == "memcached" and self.memcached:
            d["memcached"] = [self.memcached.pid]
        return d

    def store_of(self, subject):
        return {"module": "redis", "lua": "redis",
                "srcache": "memcached"}.get(subject)

    def flush(self):
        self.r("FLUSHALL")
        if self.memcached:
            s = socket.create_connection(("127.0.0.1", self.o.memcached_port))
            s.sendall(b"flush_all\r\n")
            s.recv(100)
            s.close()

    def counters(self, store):
        if store == "redis":
            return self.r.commandstats()
        if store == "memcached":
            return memcached_stats(self.o.memcached_port)
        return {}

    # --- one scenario
    def scenario(self, name, front, port, path=None, size="1k",
                 duration=None, delay_ms=0, connections=None, tag=None):
        o = self.o
        path = path or PATHS.get(name, "/orders")
        subject, mode = SCENARIOS[name]
        store = self.store_of(subject)
        duration = duration or o.duration
        tag = tag or name
        busy = wait_idle(o)
        runid = "%s-%s-%d" % (name, size, random.randrange(1 << 30))
        keys = o.keys if size == "1k" else max(8, o.keys * 1024 // SIZES[size]
                                               // 4)
        if mode == "cycle":
            prepare(name, port, path, runid, keys, size)
        if o.warmup > 0:
            run_wrk(o, port, mode, runid + "w" if mode == "unique" else runid,
                    o.warmup, path, keys, delay_ms, connections)
        sample = None
        if subject == "module" and tag in ("miss", "hit"):
            sample = lambda: self.client_list(front)
        best = None
        for attempt in range(o.retries + 1):
            if attempt:
                wait_idle(o)
            if mode == "unique":
                runid = "%s-%s-%d" % (name, size, random.randrange(1 << 30))
            if store == "redis":
                self.r("CONFIG", "RESETSTAT")
            c0 = self.counters(store)
            perf = self.perf_start(tag, self.procs(front, store)) \
                if o.perf else None
            try:
                res = run_wrk(o, port, mode, runid, duration, path, keys,
                              delay_ms, connections,
                              self.procs(front, store), sample)
            finally:
                if perf:
                    self.perf_stop(tag, perf, front)
            c1 = self.counters(store)
            res["store_delta"] = self.delta(store, c0, c1)
            res["others_pct"] = 100 * res["cpu_other"] / (
                res["wall"] * (os.cpu_count() or 1))
            res["attempts"] = attempt + 1
            if mode == "unique" or size != "1k":
                self.flush()
            if best is None or res["others_pct"] < best["others_pct"]:
                best = res
            if res["others_pct"] <= o.max_others:
                break
            log("  %-22s others used %.0f%% of the machine meanwhile%s"
                % (tag, res["others_pct"],
                   ", measuring again" if attempt < o.retries else ""))
        res = best
        res["busy"] = busy
        res["subject"], res["mode"], res["size"] = subject, mode, size
        res["connections"] = connections or o.connections
        res["delay_ms"] = delay_ms
        runs = self.runs.setdefault(tag, [])
        runs.append(res)
        # with --repeat: the run with the median req/s stands for the tag
        self.results[tag] = sorted(runs, key=lambda x: x["rps"])[
            (len(runs) - 1) // 2]
        self.results[tag]["all_rps"] = [round(x["rps"]) for x in runs]
        self.results[tag]["all_split"] = [fmt_split(x.get("split"))
                                          for x in runs]
        cpu = res["cpu"]
        n = res["requests"] or 1
        log("  %-22s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  "
            "cpu/req: %s" % (
                tag, res["rps"], res["p50"] / 1000, res["p99"] / 1000,
                res["errors"],
                " ".join("%s %.0fus" % (k, v / n * 1e6)
                         for k, v in cpu.items())))
        if res["store_delta"]:
            log("  %-22s per request: %s" % ("", per_request_text(res)))
        if res["errors"]:
            self.notes.append("%s: %d errors (status>399 %d, timeouts %d)"
                              % (tag, res["errors"], res["status"],
                                 res["timeout"]))
        return res

    # --- perf: where the CPU time goes, natively (cpu-clock sampling)
    def perf_start(self, tag, procs):
        pids = [p for v in procs.values() for p in v]
        out = os.path.join(self.o.workdir, "perf-%s.data" % tag)
        p = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock",
                              "-F", "2999", "-o", out, "-p",
                              ",".join(map(str, pids))],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             preexec_fn=_die_with_parent)
        time.sleep(0.3)
        return p, out

    def perf_stop(self, tag, perf, front):
        p, out = perf
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        rep = subprocess.run(
            ["perf", "report", "-i", out, "--stdio", "--no-children",
             "--sort", "comm,dso,sym", "--percent-limit", "0.7"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode(
                errors="replace")
        dso = subprocess.run(
            ["perf", "report", "-i", out, "--stdio", "--no-children",
             "--sort", "comm,dso", "--percent-limit", "0.5"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode(
                errors="replace")
        keep = lambda t: "\n".join(l for l in t.splitlines()
                                   if l.strip() and not l.startswith("#"))
        self.extra.setdefault("perf", {})[tag] = {
            "by_dso": keep(dso), "by_symbol": keep(rep)}
        log("  perf %s, by process and object:\n%s" % (tag, keep(dso)))

    def delta(self, store, c0, c1):
        if store == "redis":
            out = {}
            for cmd, v in c1.items():
                calls = v["calls"] - c0.get(cmd, {}).get("calls", 0)
                usec = v["usec"] - c0.get(cmd, {}).get("usec", 0)
                if calls and cmd not in ("config", "info", "client"):
                    out[cmd] = {"calls": calls, "usec": usec}
            return out
        if store == "memcached":
            keys = ("cmd_get", "get_hits", "get_misses", "cmd_set",
                    "curr_connections")
            return {k: {"calls": c1.get(k, 0) - (0 if k ==
                                                 "curr_connections"
                                                 else c0.get(k, 0)),
                        "usec": None}
                    for k in keys}
        return {}

    def client_list(self, front):
        text = self.r("CLIENT", "LIST").decode()
        me = self.r("CLIENT", "ID")
        socks = client_sockets(front.pids())
        rows = []
        for line in text.splitlines():
            d = dict(x.split("=", 1) for x in line.split() if "=" in x)
            if d.get("id") == str(me):
                continue
            port = int(d["addr"].rsplit(":", 1)[1])
            rows.append({"addr": d["addr"], "cmd": d.get("cmd"),
                         "age": d.get("age"), "tot-mem": d.get("tot-mem"),
                         "qbuf": d.get("qbuf"), "omem": d.get("omem"),
                         "pid": socks.get(port)})
        return rows

    def worker_rss(self, front):
        return {p: vm_rss(p) for p in front.pids()}

    # --- subjects
    def front(self, subject):
        port = free_port()
        ng = Nginx("front-" + subject, self.o.workdir,
                   subject_conf(subject, self.o, port), self.o.workers)
        self.start(ng, port)
        check_subject(subject, port)
        return ng, port

    def run(self):
        o = self.o
        self.start_backends()
        log("bench: wrk -t%d -c%d, %gs per scenario (+%gs warm-up), %d "
            "front workers; work dir %s"
            % (o.threads, o.connections, o.duration, o.warmup, o.workers,
               o.workdir))
        subjects = []
        for s in o.scenarios:
            if SCENARIOS[s][0] not in subjects:
                subjects.append(SCENARIOS[s][0])
        for self.rep in range(1 if o.check else o.repeat):
            if o.repeat > 1:
                log("round %d of %d" % (self.rep + 1, o.repeat))
            for subject in subjects:
                self.run_subject(subject)
        if o.paired and not o.check:
            self.paired()

    def run_subject(self, subject):
        o = self.o
        first = self.rep == 0
        ng, port = self.front(subject)
        if o.check:
            try:
                if subject in ("module", "lua", "srcache"):
                    for size in o.size_list:
                        prestore(port, "/orders/" + size
                                 if size != "1k" else "/orders",
                                 "check-%s-%d" % (size, os.getpid()), 2,
                                 RESPONSES[size].encode())
                log("  %s: answers, stores and replays" % subject)
            finally:
                self.stop(ng)
            return
        try:
            rss = []
            if subject == "module":
                rss.append(("start", 0, self.worker_rss(ng)))
            for name in o.scenarios:
                if SCENARIOS[name][0] == subject:
                    self.scenario(name, ng, port)
            if subject == "plain" and o.latency and first:
                self.moderate(ng, port, "baseline")
            if subject == "module" and first:
                if o.latency:
                    self.moderate(ng, port, "miss")
                    self.moderate(ng, port, "hit")
                rss.append(("after the 1 KiB runs",
                            self.requests_of("module"),
                            self.worker_rss(ng)))
                if o.sizes:
                    self.sizes(ng, port, "module")
                    rss.append(("after the 64 KiB / 1 MiB runs",
                                self.requests_of("module"),
                                self.worker_rss(ng)))
                if o.large:
                    self.large(ng, port)
                    rss.append(("after the large records",
                                self.requests_of("module"),
                                self.worker_rss(ng)))
                self.extra["rss"] = rss
            if subject == "plain" and o.sizes and first:
                self.sizes(ng, port, "plain")
            errs = ng.errors()
            if errs and first:
                self.notes.append("%s error.log: %d [warn]+ lines, "
                                  "last: %s" % (subject, len(errs),
                                                errs[-1]))
        finally:
            self.stop(ng)

    # --- --paired: each target ratio from alternating slices
    def paired(self):
        """For each target whose two scenarios are both chosen and send
        their keys alike (both replay stored keys, "cycle", or both a new
        key per request, "unique", then fresh keys each slice), both
        fronts up at once and N pairs of slices of --duration, one of
        each, in alternating order: the machine's drift between rounds
        (req/s moved by up to a third here) falls on both sides of each
        pair alike."""
        o = self.o
        pairs = [(label, a, b, tmin) for label, a, b, tmin in TARGETS
                 if tmin is not None and a in o.scenarios
                 and b in o.scenarios
                 and SCENARIOS[a][1] == SCENARIOS[b][1]]
        if not pairs:
            return
        log("paired slices: %d pairs of %gs" % (o.paired, o.duration))
        fronts = {}
        out = {}
        try:
            for _, a, b, _ in pairs:
                for name in (a, b):
                    subject = SCENARIOS[name][0]
                    if subject not in fronts:
                        fronts[subject] = self.front(subject)
            setup = {}
            for _, a, b, _ in pairs:
                for name in (a, b):
                    if name in setup:
                        continue
                    ng, port = fronts[SCENARIOS[name][0]]
                    path = PATHS.get(name, "/orders")
                    mode = SCENARIOS[name][1]
                    runid = "paired-%s-%d" % (name, random.randrange(1 << 30))
                    if mode == "cycle":
                        prepare(name, port, path, runid, o.keys)
                    if o.warmup > 0:
                        run_wrk(o, port, mode, runid + "-w", o.warmup, path,
                                o.keys)
                    setup[name] = (ng, port, path, runid, mode)
            for label, a, b, tmin in pairs:
                rows = []
                for i in range(o.paired):
                    wait_idle(o)
                    got = {}
                    for name in ((a, b) if i % 2 else (b, a)):
                        ng, port, path, runid, mode = setup[name]
                        if mode != "cycle":
                            # a new key per request: fresh ones each slice
                            runid = "%s-%d" % (runid, i)
                        store = self.store_of(SCENARIOS[name][0])
                        got[name] = run_wrk(o, port, mode, runid,
                                            o.duration, path, o.keys, 0,
                                            None, self.procs(ng, store))
                    ra, rb = got[a], got[b]
                    rows.append({"rps": [round(rb["rps"]), round(ra["rps"])],
                                 "ratio": ra["rps"] / rb["rps"],
                                 "cost_ratio": cpu_per_request(rb)
                                 / cpu_per_request(ra)})
                    log("  %-22s pair %d: %.0f / %.0f req/s = %.2f "
                        "(CPU-cost %.2f)" % (label, i + 1, ra["rps"],
                                             rb["rps"], rows[-1]["ratio"],
                                             rows[-1]["cost_ratio"]))
                out[label] = {"target": tmin, "pairs": rows}
        finally:
            for ng, _ in fronts.values():
                self.stop(ng)
        self.extra["paired"] = out

    def requests_of(self, subject):
        # measured runs only; warm-ups and pre-stores add a little
        return int(sum(r["requests"] for runs in self.runs.values()
                       for r in runs if r["subject"] == subject))

    def moderate(self, ng, port, name):
        o = self.o
        base = self.results.get("baseline")
        rps = base["rps"] if base else 5000
        target = max(100, rps * o.moderate)
        delay = max(1, round(o.moderate_connections * 1000 / target))
        self.scenario(name, ng, port, duration=max(3, o.duration // 2),
                      delay_ms=delay, connections=o.moderate_connections,
                      tag=name + "@moderate")

    def sizes(self, ng, port, subject):
        o = self.o
        names = ["baseline"] if subject == "plain" else ["miss", "hit"]
        for size in o.size_list:
            if size == "1k":
                continue
            for name in names:
                self.scenario(name, ng, port, path="/orders/" + size,
                              size=size, duration=max(3, o.duration // 2),
                              tag="%s@%s" % (name, size))

    # --- large records beside small requests
    def large(self, ng, port):
        """p99 of small HITs while 10 MB and 60 MB records are stored and
        replayed on the same workers, and what Redis sends for a duplicate
        that does not replay (another body: 422) and for a replay."""
        o = self.o
        stop = threading.Event()
        done = {"stored": 0, "replayed": 0, "bad": 0}

        def replay_when_stored(conn, path, key, body=None):
            # the client has the response before Redis has the record:
            # 409 until the store is through
            for _ in range(600):
                st, _, got = post(conn, path, key, body)
                if st != 409:
                    return st, got
                time.sleep(0.05)
            return st, got

        def big_loop():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            n = 0
            try:
                while not stop.is_set():
                    for name, size in LARGE.items():
                        key = "large-%s-%d-%d" % (name, os.getpid(), n)
                        n += 1
                        for what in ("stored", "replayed"):
                            st, body = replay_when_stored(conn,
                                                          "/large/" + name,
                                                          key)
                            ok = st == 200 and len(body) == size
                            done[what if ok else "bad"] += 1
                            if stop.is_set():
                                return
            finally:
                conn.close()

        t = threading.Thread(target=big_loop, daemon=True)
        t.start()
        try:
            res = self.scenario("hit", ng, port,
                                duration=max(5, o.duration),
                                connections=o.moderate_connections,
                                tag="hit@large")
        finally:
            stop.set()
            t.join(120)
        out = {"p50": res["p50"], "p99": res["p99"], "rps": res["rps"],
               "errors": res["errors"], "big": dict(done)}
        # Redis output per duplicate and per replay of the 60 MB record
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            key = "large-egress-%d" % os.getpid()
            post(conn, "/large/60m", key)
            replay_when_stored(conn, "/large/60m", key)

            def egress(body, count):
                b0 = int(self.r.info("stats")["total_net_output_bytes"])
                sts = [post(conn, "/large/60m", key, body)[0]
                       for _ in range(count)]
                b1 = int(self.r.info("stats")["total_net_output_bytes"])
                return (b1 - b0) / count, sts
            out["dup_bytes"], sts = egress(b'{"other":"body"}', 5)
            out["dup_status"] = sorted(set(sts))
            out["replay_bytes"], sts = egress(None, 2)
            out["replay_status"] = sorted(set(sts))
        finally:
            conn.close()
        log("  large records: p99 %.2f ms of small HITs, %s; Redis output "
            "%.0f B per 422 duplicate, %.1f MB per replay"
            % (out["p99"] / 1000, out["big"], out["dup_bytes"],
               out["replay_bytes"] / 1e6))
        self.extra["large"] = out

    # --- soak: RSS over many requests
    def soak(self):
        o = self.o
        self.start_backends()
        ng, port = self.front("module")
        try:
            out = {"before": self.worker_rss(ng), "runs": []}
            done = 0
            end = time.monotonic() + o.soak_limit
            # half misses, half hits, in slices, until soak requests
            names = ["miss", "hit"]
            i = 0
            while done < o.soak and time.monotonic() < end:
                name = names[i % 2]
                i += 1
                res = self.scenario(name, ng, port, duration=o.duration,
                                    tag="soak-%d-%s" % (i, name))
                done += int(res["requests"])
                out["runs"].append({"name": name, "requests":
                                    int(res["requests"]),
                                    "rss": self.worker_rss(ng)})
                log("  soak: %d requests, worker RSS %s" % (
                    done, ", ".join("%d: %.1f MiB" % (p, r / 1048576)
                                    for p, r in self.worker_rss(ng).items()
                                    if r)))
            out["after"] = self.worker_rss(ng)
            out["requests"] = done
            self.extra["soak"] = out
        finally:
            self.stop(ng)


SCRIPT_CMDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall")
OWN_CMDS = ("config", "info", "client|id", "client|list", "flushall",
            "config|resetstat")


def per_request_text(res):
    """Round trips per request, and what ran inside scripts."""
    n = res["requests"] or 1
    d = {k: v for k, v in res["store_delta"].items()
         if k not in OWN_CMDS and k != "curr_connections"}
    scripted = any(k in d for k in SCRIPT_CMDS)

    def item(k, v):
        return "%s %.3f%s" % (k, v["calls"] / n,
                              " (%.1f us/call)" % (v["usec"] / v["calls"])
                              if v.get("usec") is not None and v["calls"]
                              else "")
    top = [item(k, v) for k, v in sorted(d.items())
           if not scripted or k in SCRIPT_CMDS]
    inner = [item(k, v) for k, v in sorted(d.items())
             if scripted and k not in SCRIPT_CMDS]
    # Redis counts a command run by a script under its own name too: the
    # module's claim is a top-level SET, and its store script runs one
    # SET per call (after one GET, the fence): the SETs beyond the
    # scripts' calls are claims.
    scripts = sum(d[k]["calls"] for k in SCRIPT_CMDS if k in d)
    if scripted and "set" in d and "get" in d and d["set"]["calls"] > scripts:
        claims = dict(calls=d["set"]["calls"] - scripts)
        top.insert(0, item("set (claims)", claims))
    text = ", ".join(top)
    if inner:
        text += "; inside the scripts: " + ", ".join(inner)
    return text


# --------------------------------------------------------------------------
# report

def machine():
    m = {"nproc": os.cpu_count()}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                m["cpu"] = line.split(":", 1)[1].strip()
                break
    m["kernel"] = os.uname().release
    m["memory_gib"] = round(os.sysconf("SC_PHYS_PAGES")
                            * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)

    def ver(argv, rx):
        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT).stdout.decode()
            mm = re.search(rx, out)
            return mm.group(1) if mm else out.strip()[:60]
        except OSError:
            return None
    m["nginx"] = ver([NGINX, "-v"], r"nginx/(\S+)")
    m["redis"] = ver(["redis-server", "--version"], r"v=(\S+)")
    m["memcached"] = ver(["memcached", "-V"], r"memcached (\S+)")
    m["wrk"] = ver(["wrk", "-v"], r"wrk (\S+ \S+)")

    def deb(pkg):
        try:
            return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL).stdout.decode()
        except OSError:
            return None
    for pkg in ("libhiredis0.14", "libnginx-mod-http-srcache-filter",
                "libnginx-mod-http-memc", "libnginx-mod-http-lua",
                "lua-nginx-redis", "libluajit2-5.1-2"):
        m[pkg] = deb(pkg)
    return m


def fmt_ms(us):
    return "%.2f" % (us / 1000)


def report(b, opts):
    R = b.results
    lines = []
    w = lines.append
    w("## Throughput and latency (wrk -t%d -c%d, %gs per scenario%s)"
      % (opts.threads, opts.connections, opts.duration,
         ", median of %d rounds" % opts.repeat if opts.repeat > 1 else ""))
    w("")
    w("| scenario | req/s | p50 ms | p99 ms | errors | CPU us/req: "
      "front nginx | upstream | store | wrk | irq | busy | others' load "
      "| connections per front worker |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ncpu = os.cpu_count() or 1
    for tag, res in R.items():
        n = res["requests"] or 1
        c = res["cpu"]
        store = c.get("redis", c.get("memcached"))
        w("| %s | %.0f | %s | %s | %d | %.1f | %.1f | %s | %.1f | %.1f | "
          "%.2f | %.0f%% | %s |" % (
              tag + (" (%s)" % ", ".join(
                  "%d%s" % (v, " at " + s if s else "") for v, s in
                  zip(res["all_rps"], res.get("all_split")
                      or [""] * len(res["all_rps"])))
                     if len(res.get("all_rps", [])) > 1 else ""),
              res["rps"], fmt_ms(res["p50"]), fmt_ms(res["p99"]),
              res["errors"], c["nginx"] / n * 1e6, c["upstream"] / n * 1e6,
              "%.1f" % (store / n * 1e6) if store is not None else "-",
              c["wrk"] / n * 1e6, res["cpu_irq"] / n * 1e6,
              sum(c.values()) / res["wall"],
              100 * res["cpu_other"] / (res["wall"] * ncpu),
              fmt_split(res.get("split")) or "-"))
    w("")
    w("CPU columns: user+system time of each process over the run, per "
      "request (front nginx: its workers; store: redis-server or "
      "memcached; irq: the machine's irq+softirq time, mostly loopback "
      "TCP, most of it already inside the processes' system time). "
      "`busy`: cores the bench's processes kept busy (2 = saturated). "
      "`others' load`: CPU time used meanwhile by processes not "
      "started by the bench, as a share of all cores; above a few per cent "
      "the row is disturbed. `connections per front worker`: wrk's "
      "connections as the kernel spread them over the front's workers "
      "(reuseport), counted in the middle of the run; they stay there for "
      "the whole run, so a round's req/s can be read beside its split "
      "(an uneven one may leave a worker short of work).")
    w("")
    w("## Ratios (same run)")
    w("")
    w("| ratio | req/s ratio | target | | CPU-cost ratio | "
      "CPU-cost ratio, store apart |")
    w("|---|---:|---:|---|---:|---:|")
    verdicts = []

    def cost_apart(res):
        # without Redis or memcached, as on a host of their own
        return cpu_per_request(res, ("redis", "memcached"))

    for label, a, bb, tmin in TARGETS:
        if a in R and bb in R:
            ratio = R[a]["rps"] / R[bb]["rps"]
            cratio = cpu_per_request(R[bb]) / cpu_per_request(R[a])
            aratio = cost_apart(R[bb]) / cost_apart(R[a])
            ok = "" if tmin is None else ("met" if ratio >= tmin
                                          else "NOT met")
            w("| %s | %.2f | %s | %s | %.2f | %.2f |" % (
                label, ratio, "-" if tmin is None else ">= %.2f" % tmin, ok,
                cratio, aratio))
            verdicts.append({"ratio": label, "value": round(ratio, 3),
                             "cost_ratio": round(cratio, 3),
                             "cost_ratio_store_apart": round(aratio, 3),
                             "target": tmin, "verdict": ok})
    w("")
    w("CPU-cost ratio: the inverse ratio of the CPU time all the bench's "
      "processes spent per request, i.e. the req/s ratio the two "
      "would have on a machine that nothing else uses and that they "
      "saturate. It varies much less than req/s from run to run on a "
      "shared machine. *Store apart*: the same without the CPU time of "
      "Redis or memcached, as when the store runs on a host of its own "
      "(the verdict stays with the req/s ratio, everything on one "
      "machine).")
    w("")
    paired = b.extra.get("paired")
    if paired:
        w("## Ratios from paired slices (--paired %d)" % opts.paired)
        w("")
        w("| ratio | pairs: req/s ratio | median | target | | "
          "CPU-cost ratio, median |")
        w("|---|---|---:|---:|---|---:|")
        for label, v in paired.items():
            med = statistics.median(p["ratio"] for p in v["pairs"])
            cmed = statistics.median(p["cost_ratio"] for p in v["pairs"])
            ok = "met" if med >= v["target"] else "NOT met"
            w("| %s | %s | %.2f | >= %.2f | %s | %.2f |" % (
                label, " ".join("%.2f" % p["ratio"] for p in v["pairs"]),
                med, v["target"], ok, cmed))
            verdicts.append({"ratio": label + " (paired)",
                             "value": round(med, 3),
                             "cost_ratio": round(cmed, 3),
                             "target": v["target"], "verdict": ok})
        w("")
        w("Each pair: one slice of --duration of each scenario, both "
          "fronts up at once, back to back, in alternating order; the "
          "median of the pairs' ratios. Drift of the machine between "
          "rounds, which the table above takes whole, falls on both sides "
          "of a pair alike.")
        w("")
    mods = [t for t in ("baseline@moderate", "miss@moderate",
                        "hit@moderate") if t in R]
    if mods:
        base = R.get("baseline@moderate")
        w("## Added latency under moderate load (%d connections, rate-"
          "limited to ~%d%% of the baseline's req/s)"
          % (opts.moderate_connections, opts.moderate * 100))
        w("")
        w("| scenario | req/s | p50 ms | p99 ms | added p99 ms | target |")
        w("|---|---:|---:|---:|---:|---|")
        for t in mods:
            r = R[t]
            if base and t != "baseline@moderate":
                add = (r["p99"] - base["p99"]) / 1000
                verdict = "met" if add < 1.0 else "NOT met"
                w("| %s | %.0f | %s | %s | %+.2f | < 1 ms: %s |"
                  % (t, r["rps"], fmt_ms(r["p50"]), fmt_ms(r["p99"]), add,
                     verdict))
                verdicts.append({"ratio": "added p99 " + t,
                                 "value": round(add, 3), "target": "< 1 ms",
                                 "verdict": verdict})
            else:
                w("| %s | %.0f | %s | %s | | |" % (t, r["rps"],
                                                  fmt_ms(r["p50"]),
                                                  fmt_ms(r["p99"])))
        w("")
    w("## Store commands per request (Redis INFO commandstats / memcached "
      "stats deltas)")
    w("")
    w("| scenario | requests | per request |")
    w("|---|---:|---|")
    for tag, res in R.items():
        if res["store_delta"]:
            w("| %s | %d | %s |" % (tag, res["requests"],
                                    per_request_text(res)))
    w("")
    w("wrk counts completed responses only; up to `connections` requests in"
      " flight at the end make the per-request figures a hair above the "
      "exact ones.")
    w("")
    for tag in ("hit", "miss"):
        rows = R.get(tag, {}).get("sample")
        if rows:
            w("## CLIENT LIST in the middle of `%s` (%d front workers)"
              % (tag, opts.workers))
            w("")
            w("```")
            for row in rows:
                w("addr=%s cmd=%s age=%s qbuf=%s omem=%s tot-mem=%s -> %s" % (
                    row["addr"], row["cmd"], row["age"], row["qbuf"],
                    row["omem"], row["tot-mem"],
                    "nginx worker pid %s" % row["pid"] if row["pid"]
                    else "not a front worker"))
            w("```")
            w("")
    rss = b.extra.get("rss")
    if rss:
        pids = list(rss[0][2])
        w("## Module worker RSS (VmRSS, KiB)")
        w("")
        w("| when | module requests so far | " + " | ".join(
            "worker %d" % p for p in pids) + " |")
        w("|---|---:|" + "---:|" * len(pids))
        for label, n, v in rss:
            w("| %s | %d | " % (label, n) + " | ".join(
                "%d" % ((v.get(p) or 0) // 1024) for p in pids) + " |")
        w("")
        w("Requests: measured runs only (warm-ups and pre-stores add a few "
          "per cent).")
        w("")
    large = b.extra.get("large")
    if large:
        w("## Large records (10 MB and 60 MB stored and replayed meanwhile)")
        w("")
        hit = R.get("hit@moderate") or R.get("hit")
        w("| measure | value |")
        w("|---|---:|")
        w("| small HITs at %d connections beside them: req/s | %.0f |"
          % (opts.moderate_connections, large["rps"]))
        w("| ... p50 / p99 ms | %s / %s |" % (fmt_ms(large["p50"]),
                                             fmt_ms(large["p99"])))
        if hit:
            w("| p99 ms of the same HITs without large records (%s) | %s |"
              % ("hit@moderate" if R.get("hit@moderate") else "hit",
                 fmt_ms(hit["p99"])))
        w("| errors of the small requests | %d |" % large["errors"])
        w("| large records stored / replayed / wrong meanwhile | %d / %d / "
          "%d |" % (large["big"]["stored"], large["big"]["replayed"],
                    large["big"]["bad"]))
        w("| Redis output per duplicate with another body (%s) | %.0f B |"
          % ("/".join(map(str, large["dup_status"])), large["dup_bytes"]))
        w("| Redis output per replay of the 60 MB record (%s) | %.1f MB |"
          % ("/".join(map(str, large["replay_status"])),
             large["replay_bytes"] / 1e6))
        w("")

    soak = b.extra.get("soak")
    if soak:
        w("## Soak: module worker RSS over %d requests" % soak["requests"])
        w("")
        w("| after requests | " + " | ".join(
            "worker %d (KiB)" % p for p in soak["before"]) + " |")
        w("|---:|" + "---:|" * len(soak["before"]))
        w("| 0 | " + " | ".join("%d" % (v // 1024)
                                for v in soak["before"].values()) + " |")
        done = 0
        for run in soak["runs"]:
            done += run["requests"]
            w("| %d (%s) | " % (done, run["name"]) + " | ".join(
                "%d" % ((run["rss"].get(p) or 0) // 1024)
                for p in soak["before"]) + " |")
        w("")
    perf = b.extra.get("perf")
    if perf:
        for tag, v in perf.items():
            w("## perf (cpu-clock samples) during `%s`" % tag)
            w("")
            w("```")
            w(v["by_dso"])
            w("")
            w(v["by_symbol"])
            w("```")
            w("")
    if b.notes:
        w("## Notes")
        w("")
        for n in b.notes:
            w("- " + n)
        w("")
    return "\n".join(lines), verdicts


# --------------------------------------------------------------------------
# profile: callgrind instruction counts per request

def profile(opts):
    """nginx single-process under callgrind, N sequential requests per
    scenario, instruction counts per request by function and object."""
    if not shutil.which("valgrind"):
        raise SetupError("valgrind is not installed (scripts/setup.sh bench)")
    b = Bench(opts)
    opts.scenarios = list(opts.profile_scenarios)
    opts.workers = 1
    b.start_backends()
    out = {}
    try:
        wait_idle(opts)
        out["redis_cost"] = redis_cost(opts, b)
        for name in opts.profile_scenarios:
            subject, mode = SCENARIOS[name]
            port = free_port()
            conf = subject_conf(subject, opts, port)
            conf = conf.replace("worker_processes 1;",
                                "worker_processes 1;\nmaster_process off;")
            ng = Nginx("profile-" + name, opts.workdir, conf, 0)
            cg = os.path.join(ng.dir, "callgrind.out")
            ng.argv = ["valgrind", "--tool=callgrind",
                       "--callgrind-out-file=" + cg,
                       "--instr-atstart=no"] + ng.argv
            ng.test = lambda: None
            ng.stop_grace = 120
            b.start(ng, port)
            try:
                wait_port(port, 60, ng.proc)
                runid = "prof-%d" % random.randrange(1 << 30)
                conn = http.client.HTTPConnection("127.0.0.1", port,
                                                  timeout=30)
                n = opts.profile_requests
                path = PATHS.get(name, "/orders")
                if mode == "cycle" and subject == "module":
                    prestore(port, path, runid, opts.keys,
                             RESPONSE_1K.encode())
                # warm-up outside the measurement
                for i in range(50):
                    post(conn, path, "%s-w%d" % (runid, i)
                         if mode == "unique" else "%s-%d"
                         % (runid, i % opts.keys))
                subprocess.run(["callgrind_control", "-i", "on",
                                str(ng.pid)], stdout=subprocess.DEVNULL,
                               check=True)
                for i in range(n):
                    key = ("%s-u%d" % (runid, i) if mode == "unique"
                           else "%s-%d" % (runid, i % opts.keys))
                    st, _, body = post(conn, path, key)
                    if st != 200:
                        raise SetupError("profile %s: %d" % (name, st))
                subprocess.run(["callgrind_control", "-i", "off",
                                str(ng.pid)], stdout=subprocess.DEVNULL,
                               check=True)
                conn.close()
            finally:
                b.stop(ng)
            out[name] = summarize_callgrind(cg, n)
            log_profile(name, out[name], n)
    finally:
        b.stop_all()
    return out


def redis_cost(opts, b):
    """Redis' own time per call (INFO commandstats usec) of the module's
    claim (native SET NX GET PX) and store script, next to the native
    commands inside them, for each response size. Sequential calls, no
    nginx involved."""
    r = b.r
    lua = os.path.join(opts.source, "src", "lua")
    if not os.path.isdir(lua):
        return None
    with open(os.path.join(lua, "store.lua"), "rb") as f:
        store = r("SCRIPT", "LOAD", f.read()).decode()
    fp, owner = b"f" * 64, b"o" * 40
    inflight = b"idem1 inflight " + fp + b" " + owner + b" 0 000\r\n\r\n"
    headers = b"Content-Type: application/json\r\n"
    out = {}
    n = opts.redis_cost_calls
    for size in opts.size_list:
        body = RESPONSES[size].encode()
        record = (b"idem1 done " + fp + b" " + owner + b" 0 200\r\n"
                  + headers + b"\r\n" + body)
        calls = max(20, n * 1024 // SIZES[size]) if size != "1k" else n
        key = "cost:%s" % size
        row = {}

        def usec(cmd, f, before=None):
            r("CONFIG", "RESETSTAT")
            for i in range(calls):
                if before:
                    before(i)
                f(i)
            st = r.commandstats()
            return st[cmd]["usec"] / st[cmd]["calls"], st
        # HIT: the claim on a completed record returns it, sets nothing
        r("SET", key, record)
        row["claim SET NX GET PX (HIT)"], _ = usec(
            "set", lambda i: r("SET", key, inflight, "NX", "GET",
                               "PX", "60000"))
        # MISS: the claim on a fresh key
        row["claim SET NX GET PX (MISS)"], _ = usec(
            "set", lambda i: r("SET", "%s:%d" % (key, i), inflight, "NX",
                               "GET", "PX", "60000"))
        for i in range(calls):
            r("DEL", "%s:%d" % (key, i))
        # store: the script on our in-flight record (reset before each
        # call, outside the script: only evalsha's time is read)
        row["store script"], st = usec(
            "evalsha", lambda i: r("EVALSHA", store, 1, key, inflight,
                                   record, "3600000"),
            before=lambda i: r("SET", key, inflight))
        row["native SET PX"], _ = usec(
            "set", lambda i: r("SET", key, record, "PX", "3600000"))
        row["native GET"], _ = usec("get", lambda i: r("GET", key))
        row["calls"] = calls
        r("DEL", key)
        out[size] = row
        log("  redis cost %s: %s" % (size, ", ".join(
            "%s %.1f us" % (k, v) for k, v in row.items() if k != "calls")))
    return out


def summarize_callgrind(path, n):
    files = [f for f in os.listdir(os.path.dirname(path))
             if f.startswith(os.path.basename(path))]
    path = os.path.join(os.path.dirname(path), sorted(files)[-1])

    def annotate(*args):
        return subprocess.run(["callgrind_annotate", "--threshold=99.9"]
                              + list(args) + [path],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL).stdout.decode(
                                  errors="replace")

    def parse(text):
        rows = []
        total = 0
        for line in text.splitlines():
            m = re.match(r"^\s*([\d,]+)\s+\(?.*?\)?\s*PROGRAM TOTALS", line)
            if m:
                total = int(m.group(1).replace(",", ""))
                continue
            m = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?)\s*"
                         r"(?:\[(\S+)\])?$", line)
            if m and ":" in m.group(2):
                rows.append((int(m.group(1).replace(",", "")),
                             m.group(2), m.group(3) or ""))
        return total, rows

    total, excl = parse(annotate())
    _, incl = parse(annotate("--inclusive=yes"))
    by_obj = {}
    for ir, fn, obj in excl:
        key = os.path.basename(obj) if obj else "?"
        by_obj[key] = by_obj.get(key, 0) + ir
    return {"total": total, "per_request": total / n,
            "exclusive": [(ir / n, fn, os.path.basename(obj))
                          for ir, fn, obj in excl[:40]],
            "inclusive": [(ir / n, fn, os.path.basename(obj))
                          for ir, fn, obj in incl[:80]],
            "by_object": sorted(((v / n, k) for k, v in by_obj.items()),
                                reverse=True),
            "file": path}


def log_profile(name, p, n):
    log("\n== %s: %d instructions per request (%d requests, callgrind)"
        % (name, p["per_request"], n))
    log("   by object: " + ", ".join("%s %.0f" % (k, v)
                                     for v, k in p["by_object"][:8]))
    log("   top exclusive:")
    for ir, fn, obj in p["exclusive"][:15]:
        log("     %9.0f  %s [%s]" % (ir, fn.split(":", 1)[1], obj))
    log("   inclusive, module and its libraries:")
    seen = set()
    for ir, fn, obj in p["inclusive"]:
        fn = fn.split(":", 1)[1]
        if fn in seen or not ("idempotency" in fn or obj in (
                "libcrypto.so.3", "libhiredis.so.0.14")
                and not fn.startswith("0x")):
            continue
        seen.add(fn)
        log("     %9.0f  %s [%s]" % (ir, fn, obj))


# --------------------------------------------------------------------------

def main():
    global NGINX, REQUEST_BODY, RESPONSE_1K, RESPONSES, BODY_FILE
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=int, default=10,
                    help="seconds per measured scenario (10)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="seconds of warm-up before each, 0: none (1)")
    ap.add_argument("--connections", "-c", type=int, default=32,
                    help="wrk connections (32)")
    ap.add_argument("--threads", "-t", type=int, default=2,
                    help="wrk threads (2)")
    ap.add_argument("--workers", type=int, default=2,
                    help="worker_processes of the front nginx (2)")
    ap.add_argument("--keys", type=int, default=256,
                    help="pre-stored keys replayed by HIT scenarios (256)")
    ap.add_argument("--paired", type=int, default=0, metavar="N",
                    help="after the rounds, each target ratio again from N "
                    "pairs of alternating slices (ceiling, then cached "
                    "HIT, then the other way round ...) with both fronts "
                    "up; reported as the median of the pairs (0: off)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over the 1 KiB scenarios; each row is then "
                    "the run with the median req/s (1)")
    ap.add_argument("--only", help="comma-separated scenarios of: "
                    + ",".join(ORDER))
    ap.add_argument("--quick", action="store_true",
                    help="3 s per scenario, 1 s warm-up")
    ap.add_argument("--no-large", dest="large", action="store_false",
                    help="skip the large records section (10 MB and 60 MB "
                    "records stored and replayed beside small requests)")
    ap.add_argument("--no-sizes", dest="sizes", action="store_false",
                    help="skip the 64 KiB / 1 MiB scaling runs")
    ap.add_argument("--sizes", dest="size_list", default="1k,64k,1m",
                    help="response sizes of the scaling runs (1k,64k,1m)")
    ap.add_argument("--no-latency", dest="latency", action="store_false",
                    help="skip the moderate-load latency runs")
    ap.add_argument("--moderate", type=float, default=0.25,
                    help="moderate load, as a fraction of the baseline's "
                    "req/s (0.25)")
    ap.add_argument("--moderate-connections", type=int, default=8)
    ap.add_argument("--soak", type=int, default=0, metavar="N",
                    help="only the RSS soak: module MISS/HIT slices until N "
                    "requests (bounded by --soak-limit)")
    ap.add_argument("--soak-limit", type=float, default=300,
                    help="seconds the soak may take at most (300)")
    ap.add_argument("--check", action="store_true",
                    help="no load: start every subject, check it answers "
                    "(and stores and replays) right, stop")
    ap.add_argument("--perf", action="store_true",
                    help="sample the front workers, upstream and store with "
                    "perf record -e cpu-clock during each run (report in "
                    "results)")
    ap.add_argument("--profile", action="store_true",
                    help="only callgrind instruction counts per request")
    ap.add_argument("--profile-requests", type=int, default=2000)
    ap.add_argument("--profile-scenarios", default="baseline,miss,hit")
    ap.add_argument("--redis-cost-calls", type=int, default=2000,
                    help="calls per size of the Redis cost measurement of "
                    "--profile (2000 at 1 KiB, fewer for larger)")
    ap.add_argument("--source", default=ROOT,
                    help="the module's source tree, for its src/lua "
                    "scripts (this checkout)")
    ap.add_argument("--idle-wait", type=float, default=300,
                    help="seconds to wait for a running prove/storm.py "
                    "before each scenario (300)")
    ap.add_argument("--max-others", type=float, default=5,
                    help="a run during which other processes used more than "
                    "this %% of the machine is measured again (5)")
    ap.add_argument("--retries", type=int, default=2,
                    help="how often a disturbed run is measured again (2)")
    ap.add_argument("--nginx", default=os.environ.get("NGINX_BIN",
                                                      "/usr/sbin/nginx"))
    ap.add_argument("--module", default=os.path.join(
        ROOT, "build", "ngx_http_idempotency_module.so"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build",
                                                      "bench"))
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory's nginx/redis files")
    opts = ap.parse_args()
    if opts.quick:
        opts.duration, opts.warmup = 3, 1
    opts.scenarios = ORDER if not opts.only else opts.only.split(",")
    for s in opts.scenarios:
        if s not in SCENARIOS:
            ap.error("unknown scenario %s" % s)
    opts.size_list = opts.size_list.split(",")
    opts.profile_scenarios = opts.profile_scenarios.split(",")
    NGINX = opts.nginx
    opts.module = os.path.abspath(opts.module)

    for tool in ("wrk", "redis-server", NGINX) + (
            ("memcached",) if "srcache-hit" in opts.scenarios
            or "srcache-miss" in opts.scenarios else ()):
        if not shutil.which(tool):
            sys.exit("bench: %s is not installed (scripts/setup.sh bench)"
                     % tool)
    if opts.perf and not shutil.which("perf"):
        sys.exit("bench: --perf needs perf (scripts/setup.sh bench)")
    if not os.path.exists(opts.module):
        sys.exit("bench: no %s (make)" % opts.module)

    os.makedirs(opts.workdir, exist_ok=True)
    run_dir = os.path.join(opts.workdir, "run-%d" % os.getpid())
    os.makedirs(run_dir)
    results_dir = opts.workdir
    opts.workdir = run_dir

    REQUEST_BODY = json_body(1024, "request").encode()
    RESPONSES = {k: json_body(v, "response-" + k) for k, v in SIZES.items()}
    RESPONSE_1K = RESPONSES["1k"]
    BODY_FILE = os.path.join(run_dir, "request.json")
    with open(BODY_FILE, "wb") as f:
        f.write(REQUEST_BODY)

    def on_term(sig, frame):
        raise Interrupted()
    signal.signal(signal.SIGTERM, on_term)

    b = Bench(opts)
    started = time.monotonic()
    status = 0
    try:
        if opts.profile:
            prof = profile(opts)
            with open(os.path.join(results_dir, "profile.json"), "w") as f:
                json.dump(prof, f, indent=1)
            log("\nbench: profile in %s/profile.json" % results_dir)
            return 0
        if opts.soak:
            b.soak()
        else:
            b.run()
    except SetupError as e:
        log("bench: %s" % e)
        status = 2
    except (KeyboardInterrupt, Interrupted):
        log("bench: interrupted")
        status = 130
    finally:
        b.stop_all()
        if not opts.keep and status == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
    if status:
        return status

    if opts.check:
        log("bench: check passed")
        return 0
    text, verdicts = report(b, opts)
    cmd = " ".join(["bench/bench.sh"] + sys.argv[1:])
    head = ("# bench results\n\ncommand: `%s`, %.0f s\n\nmachine: %s\n\n"
            % (cmd, time.monotonic() - started,
               json.dumps(machine())))
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(head + text + "\n")
    with open(os.path.join(results_dir, "results.json"), "w") as f:
        json.dump({"command": cmd, "machine": machine(),
                   "options": {k: v for k, v in vars(opts).items()
                               if isinstance(v, (int, float, str, list))},
                   "results": b.results, "extra": b.extra,
                   "verdicts": verdicts, "notes": b.notes}, f, indent=1,
                  default=str)
    log("")
    log(text)
    log("bench: %.0f s; results in %s/results.{md,json}"
        % (time.monotonic() - started, results_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
