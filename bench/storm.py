#!/usr/bin/env python3
"""Retry storm: prove that a POST behind ngx_http_idempotency_module runs
exactly once however hard its clients retry.

The tool starts, all on 127.0.0.1:
  * a counting upstream (ThreadingHTTPServer) that records one execution per
    Idempotency-Key, sleeps a random latency and answers 201 with a JSON body
    unique to that execution (it carries a fresh execution_id);
  * nginx (master + 2 workers) with the module, in front of that upstream;
  * a private redis-server, unless --redis-port / TEST_NGINX_REDIS_PORT names
    one that is already running.
Then K keys x C clients POST /orders; the C clients of a key start together
(one barrier per key) and retry like real clients on network errors, 409 and
503, honouring Retry-After with a capped, jittered back-off.

Verdict per key: it passes when the upstream ran it exactly once and every
client ended with the same 2xx status and byte-identical body, the body of
that one execution. Exit 0 when every key passed, 1 when one failed, 2 when
the set-up itself failed. The last line printed is always "N passed, M failed".

Chaos (--chaos NAME, repeatable or comma-separated): while the storm runs,
Redis is SIGKILLed and restarted (redis-kill, with AOF appendfsync always),
paused longer than the module's command timeout (redis-stall), nginx is
reloaded (reload) or loses a worker to SIGKILL (worker-kill), the upstream
resets or stalls after doing the work (upstream-reset), clients hang up
mid-request and retry (client-disconnect), or a command of yours runs
(exec: a Sentinel failover, a resharding).  A key still fails when it ran
twice or two clients ended with different answers; a client that gave up
(only 409/503/network errors until its patience ran out) is counted, not
failed.  --nodes N storms N nginx instances sharing one Redis, the clients
and retries of each key spread over them.

Python 3 standard library only.  Run from anywhere:
    python3 bench/storm.py --short
    python3 bench/storm.py                      # 2000 keys x 8 clients
    python3 bench/storm.py --wait 5s --keys 500
    python3 bench/storm.py --keys 300 --chaos redis-kill,reload
    python3 bench/storm.py --keys 300 --nodes 3
"""

import argparse
import collections
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RETRY_STATUSES = (409, 503)
MAX_THREADS = 256


class SetupError(Exception):
    """The storm could not be set up (no nginx, no module, no Redis ...)."""


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so that every finally runs."""


# --------------------------------------------------------------------------
# small helpers

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds, proc=None):
    """True once 127.0.0.1:port accepts; False after `seconds` or when
    `proc` has exited."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def parse_time(text):
    """nginx-style time ("500ms", "5s", "1m", "2") in seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError("bad time %r (e.g. 500ms, 5s, 1m)"
                                         % text)
    value = float(m.group(1))
    unit = m.group(2) or "s"
    return value / 1000 if unit == "ms" else value * 60 if unit == "m" \
        else value


def parse_latency(text):
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise argparse.ArgumentTypeError("bad latency %r (MIN:MAX in ms, "
                                         "MIN <= MAX)" % text)
    return int(m.group(1)), int(m.group(2))


def nginx_time(seconds):
    ms = int(round(seconds * 1000))
    return "%ds" % (ms // 1000) if ms % 1000 == 0 else "%dms" % ms


def short(data, limit=300):
    if data is None:
        return "-"
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) \
        else str(data)
    return text if len(text) <= limit else text[:limit] + "..."


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, int(round(p / 100.0 *
                                              (len(sorted_values) - 1))))
    return sorted_values[i]


def _proc_stat(pid):
    """(ppid, starttime) of a live pid, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    return int(fields[1]), fields[19]


def children_of(pid):
    """[(pid, starttime)] of the live children of pid (scan of /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _proc_stat(int(name))
        if st is not None and st[0] == pid:
            out.append((int(name), st[1]))
    return out


def _pdeathsig(sig):
    """preexec_fn: the child gets `sig` when this process dies, so an
    abrupt end (SIGKILL of the tool) still takes its servers down."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except Exception:  # not Linux / no ctypes: best effort only
        return None

    def fn():
        prctl(1, int(sig), 0, 0, 0)     # PR_SET_PDEATHSIG
    return fn


def start_process(argv, log_path, death_signal):
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=_pdeathsig(death_signal))
    finally:
        log.close()


def stop_process(proc, sig, grace):
    """Signal proc, wait up to `grace` seconds, then SIGKILL it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


# --------------------------------------------------------------------------
# Redis, just enough RESP for PING, SCAN and DEL

class Redis:
    def __init__(self, port, timeout=2.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout)
        self.file = self.sock.makefile("rb")

    def close(self):
        self.file.close()
        self.sock.close()

    def __call__(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self):
        line = self.file.readline()
        if not line.endswith(b"\r\n"):
            raise OSError("redis: connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise OSError("redis: " + rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise OSError("redis: bad reply %r" % line[:40])


def redis_scan(port, pattern, delete=False, max_rounds=100000):
    """Number of keys matching pattern (and delete them when asked)."""
    r = Redis(port)
    try:
        cursor, count = b"0", 0
        for _ in range(max_rounds):
            cursor, keys = r("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            count += len(keys)
            if delete and keys:
                r("DEL", *keys)
            if cursor in (b"0", "0"):
                break
        return count
    finally:
        r.close()


# --------------------------------------------------------------------------
# the counting upstream

class Upstream:
    """Counts executions per Idempotency-Key; every execution answers a body
    of its own.  With a fault rate (upstream-reset), a share of executions
    do the work (they are counted) and then reset the connection without an
    answer, or stall past nginx's proxy_read_timeout."""

    def __init__(self, latency_ms, fault_rate=0.0, fault_modes=(),
                 stall=0.0):
        self.latency = latency_ms
        self.fault_rate = fault_rate
        self.fault_modes = tuple(fault_modes)
        self.stall = stall
        self.lock = threading.Lock()
        self.executions = collections.defaultdict(list)   # key -> [bytes]
        self.meta = collections.defaultdict(list)   # key -> [(worker, fault)]
        self.faults = collections.Counter()
        self.key_mismatch = 0      # header key != key in the request body
        self.inflight = 0
        self.others = 0            # not a POST: 404
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "storm-upstream"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length) if length > 0 else b""
                key = self.headers.get("Idempotency-Key")
                worker = self.headers.get("X-Storm-Worker") or "-"
                try:
                    body_key = json.loads(payload.decode()).get("key")
                except Exception:
                    body_key = None
                if key is None:
                    key = body_key if body_key is not None else ""
                fault = None
                if upstream.fault_modes and key.startswith("storm-") \
                        and not key.endswith("-warmup") \
                        and random.random() < upstream.fault_rate:
                    fault = random.choice(upstream.fault_modes)
                with upstream.lock:
                    if body_key is not None and body_key != key:
                        upstream.key_mismatch += 1
                    runs = upstream.executions[key]
                    n = len(runs) + 1
                    body = json.dumps({"key": key,
                                       "execution_id": str(uuid.uuid4()),
                                       "n": n}).encode() + b"\n"
                    runs.append(body)
                    upstream.meta[key].append((worker, fault))
                    upstream.inflight += 1
                    if fault:
                        upstream.faults[fault] += 1
                try:
                    lo, hi = upstream.latency
                    time.sleep(random.uniform(lo, hi) / 1000.0)
                    if fault == "reset":
                        # the work is done; the answer is never sent
                        self.connection.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
                        self.close_connection = True
                        self.connection.close()
                        return
                    if fault == "stall":
                        time.sleep(upstream.stall)
                    self.send_response(201)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Location", "/orders/%s" % key)
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    self.close_connection = True     # nginx gave up on us
                finally:
                    with upstream.lock:
                        upstream.inflight -= 1

            def not_found(self):
                with upstream.lock:
                    upstream.others += 1
                body = b"not found\n"
                self.send_response(404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = \
                not_found

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024     # a storm connects all at once

            def handle_error(self, request, client_address):
                pass        # resets and stalls make the socket calls fail

        # bound now (in the main thread, before any fork), served later
        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.1},
                                       name="upstream", daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread is not None:
            self.server.shutdown()
            self.thread.join(5)
        self.server.server_close()

    def wait_idle(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self.lock:
                if self.inflight == 0:
                    return True
            time.sleep(0.02)
        return False

    def snapshot(self):
        with self.lock:
            return ({k: list(v) for k, v in self.executions.items()},
                    {k: list(v) for k, v in self.meta.items()})


# --------------------------------------------------------------------------
# nginx and redis

NGINX_CONF = """\
# written by bench/storm.py (run {run_id}, node {node}); this directory is
# the -p prefix
load_module {module};

daemon           off;
master_process   on;
worker_processes {workers};
pid              {dir}/nginx.pid;
error_log        {dir}/error.log info;

events {{
    worker_connections 1024;
}}

http {{
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path       {dir}/tmp/proxy;
    fastcgi_temp_path     {dir}/tmp/fastcgi;
    uwsgi_temp_path       {dir}/tmp/uwsgi;
    scgi_temp_path        {dir}/tmp/scgi;

    log_format storm '$pid $status $idempotency_status '
                     '"$idempotency_key" $request_time';
    access_log {dir}/access.log storm;

    server {{
        # reuseport: the kernel spreads connections over the workers
        listen 127.0.0.1:{port} reuseport;

        location / {{
            idempotency on;
            # the storm clients send no credentials: one deliberate
            # shared namespace (an empty scope would be refused)
            idempotency_scope storm;
            idempotency_redis {redis};
            idempotency_lock_ttl {lock_ttl};
{extra}            # which node and worker ran an execution (the upstream
            # records it)
            proxy_set_header X-Storm-Worker "{node}:$pid";
            proxy_pass http://127.0.0.1:{upstream_port};
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, binary, module, workdir, node=0, workers=2):
        self.binary = binary
        self.module = module
        self.dir = workdir
        self.node = node
        self.nworkers = workers
        self.proc = None
        self.port = None
        self.workers = []           # current generation [(pid, starttime)]
        self.known = {}             # every worker ever seen: pid -> start

    def conf_path(self):
        return os.path.join(self.dir, "nginx.conf")

    def error_log(self):
        return os.path.join(self.dir, "error.log")

    def start(self, run_id, redis, upstream_port, extra, lock_ttl):
        for d in ("tmp", "logs"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        last = "nginx did not start"
        for _ in range(3):             # a free port can be taken meanwhile
            self.port = free_port()
            with open(self.conf_path(), "w") as f:
                f.write(NGINX_CONF.format(run_id=run_id, module=self.module,
                                          dir=self.dir, port=self.port,
                                          node="n%d" % self.node,
                                          workers=self.nworkers,
                                          redis=redis, extra=extra,
                                          lock_ttl=nginx_time(lock_ttl),
                                          upstream_port=upstream_port))
            self.proc = start_process(
                [self.binary, "-p", self.dir + "/", "-c", self.conf_path(),
                 "-e", self.error_log()],
                os.path.join(self.dir, "nginx.stderr"), signal.SIGTERM)
            if wait_port(self.port, 10, self.proc):
                self.workers = self._wait_workers(set(), 5)
                return
            last = self._tail_errors()
            self.stop()
        raise SetupError("nginx did not start:\n" + last)

    def _children(self):
        kids = children_of(self.proc.pid) if self.proc is not None \
            and self.proc.poll() is None else []
        for pid, start in kids:
            self.known[pid] = start
        return kids

    def _wait_workers(self, old, seconds):
        """Wait until nworkers children that are not in `old` run."""
        end = time.monotonic() + seconds
        fresh = []
        while time.monotonic() < end:
            fresh = [k for k in self._children() if k not in old]
            if len(fresh) >= self.nworkers:
                break
            time.sleep(0.05)
        return fresh

    def reload(self):
        """nginx -s reload; returns once the new generation of workers runs
        (the old one finishes its requests and exits meanwhile)."""
        old = set(self._children())
        subprocess.run([self.binary, "-p", self.dir + "/", "-c",
                        self.conf_path(), "-e", self.error_log(), "-s",
                        "reload"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=10, check=True)
        self.workers = self._wait_workers(old, 10)
        return len(self.workers) >= self.nworkers

    def kill_worker(self):
        """SIGKILL one worker of the current generation; returns its pid
        once the master has started a replacement (or None)."""
        current = [k for k in self.workers if k in set(self._children())]
        if not current:
            return None
        victim = random.choice(current)
        st = _proc_stat(victim[0])
        if st is None or st[1] != victim[1]:
            return None
        os.kill(victim[0], signal.SIGKILL)
        old = set(self._children()) | {victim}
        end = time.monotonic() + 10
        while time.monotonic() < end:
            kids = self._children()
            fresh = [k for k in kids if k not in old]
            if fresh and victim not in kids:
                break
            time.sleep(0.05)
        self.workers = [k for k in self.workers if k != victim] + \
            [k for k in self._children() if k not in old]
        return victim[0]

    def _tail_errors(self):
        out = []
        for name in ("nginx.stderr", "error.log"):
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    out += f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                pass
        return "\n".join(l for l in out[-15:] if l.strip())

    def stop(self):
        """QUIT (graceful), bounded wait, KILL; then any worker left over."""
        if self.proc is None:
            return
        self._children()
        stop_process(self.proc, signal.SIGQUIT, 10)
        for pid, start in self.known.items():
            st = _proc_stat(pid)
            if st is not None and st[1] == start:     # same process still
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc = None


class PrivateRedis:
    """A redis-server of our own.  aof is None (no persistence) or the
    appendfsync policy of appendonly yes: with "always" every write is
    fsynced before it is acknowledged, so not even a host crash loses a
    claim that nginx saw."""

    def __init__(self, workdir, aof=None):
        self.dir = workdir
        self.aof = aof
        self.proc = None
        self.port = None
        self.binary = None

    def argv(self):
        argv = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--dir", self.dir, "--daemonize", "no"]
        if self.aof:
            argv += ["--appendonly", "yes", "--appendfsync", self.aof]
        else:
            argv += ["--appendonly", "no"]
        return argv

    def start(self, binary="redis-server"):
        self.binary = shutil.which(binary)
        if self.binary is None:
            raise SetupError("redis-server not found: install it, or give "
                             "--redis-port of a running Redis")
        os.makedirs(self.dir, exist_ok=True)
        for _ in range(3):
            self.port = free_port()
            self.proc = start_process(self.argv(),
                                      os.path.join(self.dir, "redis.log"),
                                      signal.SIGTERM)
            if wait_port(self.port, 10, self.proc):
                return
            self.stop()
        raise SetupError("redis-server did not start (see %s/redis.log)"
                         % self.dir)

    def kill(self):
        """SIGKILL: the crash case, no goodbye to the clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self):
        """Start again on the same port, with the same data directory (the
        AOF, when there is one, is loaded)."""
        self.proc = start_process(self.argv(),
                                  os.path.join(self.dir, "redis.log"),
                                  signal.SIGTERM)
        return wait_port(self.port, 10, self.proc)

    def stop(self):
        stop_process(self.proc, signal.SIGTERM, 10)
        self.proc = None


def redis_ping(port, seconds):
    end = time.monotonic() + seconds
    last = None
    while time.monotonic() < end:
        try:
            r = Redis(port)
            try:
                if r("PING") == "PONG":
                    return
            finally:
                r.close()
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise SetupError("Redis on 127.0.0.1:%d does not answer PING (%s)"
                     % (port, last))


# --------------------------------------------------------------------------
# the clients

class Result:
    __slots__ = ("status", "body", "ctype", "replayed", "attempts",
                 "history", "elapsed", "error", "gave_up", "nodes")

    def __init__(self):
        self.status = None
        self.body = None
        self.ctype = None
        self.replayed = False
        self.attempts = 0
        self.history = []       # one token per attempt: 201, 201r, 409, net
        self.elapsed = 0.0
        self.error = None
        self.gave_up = False    # ended on a retryable answer: no verdict
        self.nodes = set()      # nginx nodes this client's attempts went to

    def ok(self):
        return self.status is not None and 200 <= self.status < 300

    def final(self):
        """An answer the client keeps (not a retryable one it gave up on)."""
        return self.status is not None and not self.gave_up


def retryable(status, replayed):
    """What a real client retries with the same key: 409 and 503 always,
    502 and 504 unless they are a replay (a replayed answer is the
    operation's recorded outcome)."""
    return status in RETRY_STATUSES or (status in (502, 504)
                                        and not replayed)


class Client:
    """One simulated client: its own connections to nginx (one per node),
    reused (keep-alive) unless --fresh-connections, reopened after any
    error.  Attempt n of client j goes to node (j + n) mod N."""

    def __init__(self, ports, timeout, opts, stop, stats, client_no):
        self.ports = ports
        self.timeout = timeout
        self.opts = opts
        self.stop = stop
        self.stats = stats          # this thread's Counter
        self.client_no = client_no
        self.conns = {}

    def close(self, port=None):
        for p in ([port] if port is not None else list(self.conns)):
            conn = self.conns.pop(p, None)
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass

    def backoff(self, attempt, retry_after):
        cap = 0.2 * attempt
        if retry_after is not None:
            base = retry_after
        else:
            base = 0.05 * (2 ** min(attempt, 8))
        return min(base, cap) * random.uniform(0.5, 1.0)

    def hang_up(self, port, key, body):
        """Send the request on a new connection and close it after a short
        random time, before the answer in most cases (client-disconnect).
        True if the answer had not arrived when the client hung up."""
        req = (b"POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Idempotency-Key: %s\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s"
               % (key.encode(), len(body), body))
        s = socket.create_connection(("127.0.0.1", port), self.timeout)
        try:
            s.sendall(req)
            s.settimeout(random.uniform(0.005, self.opts.hangup_after))
            try:
                answered = bool(s.recv(1))
            except socket.timeout:
                answered = False
            return not answered
        finally:
            s.close()

    def post(self, key, body, deadline):
        res = Result()
        t0 = time.monotonic()
        if self.opts.give_up:
            deadline = min(deadline, t0 + self.opts.give_up)
        headers = {"Idempotency-Key": key,
                   "Content-Type": "application/json"}
        for attempt in range(1, self.opts.attempts + 1):
            res.attempts = attempt
            node = (self.client_no + attempt - 1) % len(self.ports)
            port = self.ports[node]
            res.nodes.add(node)
            self.stats["sent"] += 1
            retry_after = None
            # the first attempts are the ones that can hold the claim
            if self.opts.hangup_rate and attempt <= 2 \
                    and random.random() < self.opts.hangup_rate:
                try:
                    cut = self.hang_up(port, key, body)
                    self.stats["hangups_mid_request" if cut
                               else "hangups_after_answer"] += 1
                except OSError:
                    self.stats["hangups_failed"] += 1
                res.status, res.body, res.error = None, None, "hung up"
                res.history.append("cut")
                reason = "hangup"
            else:
                try:
                    conn = self.conns.get(port)
                    if conn is None:
                        conn = http.client.HTTPConnection(
                            "127.0.0.1", port, timeout=self.timeout)
                        self.conns[port] = conn
                    conn.request("POST", "/orders", body=body,
                                 headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    status = resp.status
                    if resp.will_close or self.opts.fresh_connections:
                        self.close(port)
                except (OSError, http.client.HTTPException) as e:
                    self.close(port)
                    reason = "network"
                    res.status, res.body, res.error = None, None, \
                        "%s: %s" % (type(e).__name__, e)
                    res.history.append("net")
                else:
                    replayed = (resp.getheader("Idempotent-Replayed") or "") \
                        .strip().lower() == "true"
                    res.status, res.body, res.error = status, data, None
                    res.ctype = resp.getheader("Content-Type")
                    res.replayed = replayed
                    # a held key's answer: the outcome is unknown, and
                    # the module will not run it again (a final answer)
                    held = status == 502 and b"outcome-unknown" in data
                    res.history.append("%d%s" % (status,
                                                 "r" if replayed or held
                                                 else ""))
                    if held or not retryable(status, replayed):
                        break
                    reason = str(status)
                    ra = resp.getheader("Retry-After")
                    if ra is None:
                        if status in RETRY_STATUSES:
                            self.stats["no_retry_after_%d" % status] += 1
                    else:
                        try:
                            retry_after = max(0.0, float(ra.strip()))
                        except ValueError:
                            self.stats["bad_retry_after"] += 1
            if attempt == self.opts.attempts or self.stop.is_set() \
                    or time.monotonic() >= deadline:
                self.stats["gave_up"] += 1
                res.gave_up = True
                break
            self.stats["retry_" + reason] += 1
            delay = self.backoff(attempt, retry_after)
            delay = min(delay, max(0.0, deadline - time.monotonic()))
            if self.stop.wait(delay):
                self.stats["gave_up"] += 1
                res.gave_up = True
                break
        res.elapsed = time.monotonic() - t0
        return res


class Storm:
    """K keys, C clients each; lanes of C threads take one key at a time,
    the C threads of a lane meet at a barrier so that they collide."""

    def __init__(self, opts, ports, run_id, deadline, retry_deadline):
        self.opts = opts
        self.ports = ports
        self.run_id = run_id
        self.deadline = deadline              # no new key after it
        self.retry_deadline = retry_deadline  # no retry after it
        self.keys = ["storm-%s-%05d" % (run_id, i) for i in range(opts.keys)]
        self.results = [None] * opts.keys       # [ [Result] * C ]
        self.stop = threading.Event()
        self.next_index = 0
        self.index_lock = threading.Lock()
        self.started = 0
        self.stats = []
        self.threads = []
        self.timeout = max(5.0, 3 * opts.latency[1] / 1000.0
                           + (opts.wait or 0) + 2)

    def body(self, i):
        return json.dumps({"key": self.keys[i], "order": i,
                           "amount": 100 + i % 997,
                           "currency": "EUR"}).encode()

    def take(self):
        with self.index_lock:
            if self.stop.is_set() or time.monotonic() >= self.deadline \
                    or self.next_index >= len(self.keys):
                return None
            i = self.next_index
            self.next_index += 1
            self.started += 1
            self.results[i] = [None] * self.opts.clients
            return i

    def run(self):
        c = self.opts.clients
        lanes = max(1, min(self.opts.threads, MAX_THREADS) // c)
        lanes = min(lanes, len(self.keys)) or 1
        for lane_no in range(lanes):
            lane = {"key": None}

            def action(lane=lane):
                lane["key"] = self.take()
            barrier = threading.Barrier(c, action=action)
            for client_no in range(c):
                stats = collections.Counter()
                self.stats.append(stats)
                t = threading.Thread(target=self.worker,
                                     args=(lane, barrier, client_no, stats),
                                     name="lane%d-c%d" % (lane_no, client_no),
                                     daemon=True)
                self.threads.append(t)
        for t in self.threads:
            t.start()

    def worker(self, lane, barrier, client_no, stats):
        client = Client(self.ports, self.timeout, self.opts, self.stop, stats,
                        client_no)
        try:
            while True:
                try:
                    barrier.wait(max(1.0, self.retry_deadline
                                     - time.monotonic()
                                     + self.timeout + 5))
                except threading.BrokenBarrierError:
                    return
                i = lane["key"]
                if i is None:
                    return
                try:
                    res = client.post(self.keys[i], self.body(i),
                                      self.retry_deadline)
                except Exception as e:          # a bug here: never hang
                    res = Result()
                    res.error = "client crashed: %r" % e
                    barrier.abort()
                self.results[i][client_no] = res
        finally:
            client.close()

    def join(self, seconds):
        end = time.monotonic() + seconds
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def done(self):
        return not any(t.is_alive() for t in self.threads)

    def progress(self):
        with self.index_lock:
            return self.started


# --------------------------------------------------------------------------
# chaos: faults injected while the storm runs

EVENT_SCENARIOS = ("redis-kill", "redis-stall", "reload", "worker-kill",
                   "exec")
STEADY_SCENARIOS = ("upstream-reset", "client-disconnect")
SCENARIOS = EVENT_SCENARIOS + STEADY_SCENARIOS


class Chaos:
    """A thread that injects the event scenarios while the clients run:
    the first after --chaos-start, then one every --chaos-interval
    (after the previous one is over), --chaos-events of each, in turn.  The
    steady scenarios (upstream-reset, client-disconnect) are on for the
    whole storm and need no thread.

    The thread lives until the run ends (finish()): a Redis it restarted
    has PR_SET_PDEATHSIG, which fires when the thread that started it
    exits."""

    def __init__(self, opts, storm, nginxes, redis, redis_port):
        self.opts = opts
        self.storm = storm
        self.nginxes = nginxes
        self.redis = redis
        self.redis_port = redis_port
        self.events = []            # (t, scenario, detail, ok)
        self.killed = []            # pids of killed workers
        self.stop = threading.Event()       # no more events
        self.idle = threading.Event()       # no event in progress
        self.end = threading.Event()        # the thread may exit
        self.thread = None
        self.t0 = None
        plan = [n for n in EVENT_SCENARIOS if n in opts.chaos]
        self.plan = [n for _ in range(opts.chaos_events) for n in plan]

    def start(self, t0):
        self.t0 = t0
        if self.plan:
            self.thread = threading.Thread(target=self.run, name="chaos",
                                           daemon=True)
            self.thread.start()

    def quiesce(self, seconds):
        """No new event; wait for the one in progress to end."""
        self.stop.set()
        if self.thread is not None:
            self.idle.wait(seconds)

    def finish(self, seconds):
        self.stop.set()
        self.end.set()
        if self.thread is not None:
            self.thread.join(seconds)

    def storm_busy(self):
        return not self.storm.stop.is_set() and not self.storm.done()

    def note(self, scenario, detail, ok=True):
        t = time.monotonic() - self.t0
        self.events.append((t, scenario, detail, ok))
        print("storm: chaos %.1fs %s: %s%s" % (t, scenario, detail,
                                               "" if ok else " (FAILED)"),
              flush=True)

    def run(self):
        try:
            self.inject()
        finally:
            self.idle.set()
            self.end.wait()

    def inject(self):
        if self.stop.wait(self.opts.chaos_start):
            return
        node = 0
        for scenario in self.plan:
            if not self.storm_busy():
                return
            try:
                if scenario == "redis-kill":
                    self.redis_kill()
                elif scenario == "redis-stall":
                    self.redis_stall()
                elif scenario == "reload":
                    ng = self.nginxes[node % len(self.nginxes)]
                    node += 1
                    ok = ng.reload()
                    self.note(scenario, "node %d reloaded, new workers %s"
                              % (ng.node, " ".join(str(p) for p, _ in
                                                   ng.workers)), ok)
                elif scenario == "exec":
                    self.run_command()
                elif scenario == "worker-kill":
                    ng = self.nginxes[node % len(self.nginxes)]
                    node += 1
                    pid = ng.kill_worker()
                    if pid is not None:
                        self.killed.append("n%d:%d" % (ng.node, pid))
                    self.note(scenario, "node %d: worker %s SIGKILLed, "
                              "master started %s" % (
                                  ng.node, pid, " ".join(
                                      str(p) for p, _ in ng.workers)),
                              pid is not None)
            except Exception as e:      # noted; the storm goes on
                self.note(scenario, "error: %r" % e, False)
            if self.stop.wait(self.opts.chaos_interval):
                return

    def redis_kill(self):
        t = time.monotonic()
        self.redis.kill()
        self.stop.wait(self.opts.redis_down)
        ok = self.redis.restart()
        try:
            redis_ping(self.redis.port, 20)     # LOADING while the AOF loads
        except SetupError:
            ok = False
        self.note("redis-kill", "SIGKILL, restarted after %.1fs, answering "
                  "after %.1fs (%s)" % (self.opts.redis_down,
                                        time.monotonic() - t,
                                        "AOF appendfsync %s"
                                        % self.redis.aof if self.redis.aof
                                        else "no persistence"), ok)

    def run_command(self):
        """--chaos-exec: someone else's fault (a Sentinel failover, a
        Cluster resharding), run by /bin/sh, at most 120 s, with
        STORM_NGINX_PORTS, STORM_NGINX_PIDS (masters) and STORM_REDIS_PORT
        in its environment."""
        t = time.monotonic()
        env = dict(os.environ,
                   STORM_NGINX_PORTS=" ".join(str(ng.port)
                                              for ng in self.nginxes),
                   STORM_NGINX_PIDS=" ".join(str(ng.proc.pid)
                                             for ng in self.nginxes
                                             if ng.proc is not None),
                   STORM_REDIS_PORT=str(self.redis_port or ""))
        try:
            p = subprocess.run(["/bin/sh", "-c", self.opts.chaos_exec],
                               env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=120)
            out = p.stdout.decode("utf-8", "replace").strip()
            ok = p.returncode == 0
            detail = "exit %d" % p.returncode
        except subprocess.TimeoutExpired:
            out, ok, detail = "", False, "still running after 120 s"
        self.note("exec", "%r: %s after %.1fs%s" % (
            self.opts.chaos_exec, detail, time.monotonic() - t,
            ": " + short(out, 200) if out else ""), ok)

    def redis_stall(self):
        ms = int(self.opts.stall * 1000)
        r = Redis(self.redis_port)
        try:
            r("CLIENT", "PAUSE", ms, "ALL")
        finally:
            r.close()
        self.note("redis-stall", "CLIENT PAUSE %d ALL (the module's "
                  "timeout=%s)" % (ms, nginx_time(self.opts.redis_timeout)
                                   if self.opts.redis_timeout else "1s"))
        self.stop.wait(self.opts.stall)

    def counts(self):
        c = collections.Counter()
        for _, scenario, _, ok in self.events:
            c[scenario, ok] += 1
        return c


# --------------------------------------------------------------------------
# report

def judge(storm, executions, meta, lenient):
    """Verdict per key: (key, problems, runs, results, outcome).

    Always a failure: a second execution (DUPLICATE), two clients that kept
    different answers (DIVERGENT), an answer that is none of the upstream's
    responses, a 2xx for a key that never ran.  A client that gave up (it
    only got 409, 503, 502/504 or network errors until its attempts or
    patience ran out) fails the key only without --chaos (lenient False);
    under chaos it is counted: the outcome says whether the key was
    answered to every client ("ok"), to some ("partly"), or to none
    ("unresolved-ran": it ran once, its answer was lost or is still held
    by an in-flight claim; "unresolved-never": it never ran).  A key whose
    one execution the upstream broke off (upstream-reset) may end with the
    same recorded 502/504 for every client, or the module's 502
    outcome-unknown answer that holds it ("stored-error")."""
    verdicts = []
    for i, key in enumerate(storm.keys):
        runs = executions.get(key, [])
        faults = [f for _, f in meta.get(key, []) if f]
        results = storm.results[i]
        problems = []
        if results is None:
            problems.append("not started (deadline or interrupt)")
            verdicts.append((key, problems, runs, results, "not-started"))
            continue
        if len(runs) > 1:
            problems.append("DUPLICATE: ran %d times upstream" % len(runs))
        finals = [r for r in results if r is not None and r.final()]
        gave_up = [j for j, r in enumerate(results)
                   if r is not None and not r.final()]
        for j, r in enumerate(results):
            if r is None:
                problems.append("client %d: no result (did not finish)" % j)
            elif not r.final() and not lenient:
                problems.append("client %d: ended with %s after %d "
                                "attempts [%s]%s"
                                % (j, r.status if r.status else "no response",
                                   r.attempts, " ".join(r.history),
                                   ": " + r.error if r.error else ""))
        answers = set((r.status, r.body) for r in finals)
        if len(answers) > 1:
            problems.append("DIVERGENT: %d different (status, body) pairs"
                            % len(answers))
        elif len(answers) == 1:
            status, body = next(iter(answers))
            if 200 <= status < 300:
                if not runs:
                    problems.append("a %d answer, but the key never ran "
                                    "upstream" % status)
                elif body not in runs:
                    problems.append("DIVERGENT: body is none of the "
                                    "upstream's responses")
                elif body != runs[0] and len(runs) > 1:
                    problems.append("body is from execution %d, not the "
                                    "first" % (runs.index(body) + 1))
                if status != 201:
                    problems.append("status %d, the upstream answered 201"
                                    % status)
            elif not (status in (502, 504) and faults and len(runs) == 1):
                problems.append("ended with %d (the upstream %s)"
                                % (status, "broke off" if faults
                                   else "answered 201"))
        if not runs and not lenient:
            problems.append("never ran upstream")
        ctypes = set(r.ctype for r in finals if r.ok())
        if ctypes and ctypes != {"application/json"}:
            problems.append("DIVERGENT: Content-Type %s"
                            % ", ".join(sorted(map(str, ctypes))))
        if problems:
            outcome = "failed"
        elif not finals:
            outcome = "unresolved-ran" if runs else "unresolved-never"
        elif gave_up:
            outcome = "partly"
        elif not finals[0].ok():
            outcome = "stored-error"
        else:
            outcome = "ok"
        verdicts.append((key, problems, runs, results, outcome))
    return verdicts


# module log lines worth counting under chaos: (name, text in the line)
LOG_EVENTS = (
    ("recorded after the client went away", "the rest of the response is "
     "read for the record only"),
    ("store/release kept for a retry", "kept for a retry for up to"),
    ("settled after a retry", "succeeded after a retry"),
    ("given up", "idempotency: gave up"),
    ("claim lost", "was lost"),
    ("kept until the lock TTL", "the claim is kept until"),
)


def read_logs(dirs):
    events = collections.Counter()
    levels = collections.Counter()
    samples = collections.defaultdict(list)
    pattern = re.compile(r"\[(emerg|alert|crit|error|warn)\]")
    idem = collections.Counter()
    by_pid = collections.Counter()
    status = collections.Counter()
    for node, workdir in enumerate(dirs):
        tag = "n%d:" % node if len(dirs) > 1 else ""
        try:
            with open(os.path.join(workdir, "error.log"), "rb") as f:
                for raw in f:
                    line = raw.decode("utf-8", "replace").rstrip()
                    for name, needle in LOG_EVENTS:
                        if needle in line:
                            events[name] += 1
                    m = pattern.search(line)
                    if m:
                        levels[m.group(1)] += 1
                        if len(samples[m.group(1)]) < 8:
                            samples[m.group(1)].append(tag + line)
        except OSError:
            pass
        try:
            with open(os.path.join(workdir, "access.log"), "rb") as f:
                for raw in f:
                    parts = raw.decode("utf-8", "replace").split()
                    if len(parts) >= 3:
                        by_pid[tag + parts[0]] += 1
                        status[parts[1]] += 1
                        idem[parts[2]] += 1
        except OSError:
            pass
    return levels, samples, idem, by_pid, status, events


def fmt_counter(c):
    return ", ".join("%s %d" % (k, v) for k, v in
                     sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def write_report(path, verdicts):
    with open(path, "w") as f:
        for key, problems, runs, results, outcome in verdicts:
            f.write(json.dumps({
                "key": key, "passed": not problems, "problems": problems,
                "outcome": outcome,
                "executions": [short(b, 10000) for b in runs],
                "clients": [None if r is None else {
                    "status": r.status, "replayed": r.replayed,
                    "attempts": r.attempts, "history": r.history,
                    "elapsed": round(r.elapsed, 4), "error": r.error,
                    "content_type": r.ctype, "gave_up": r.gave_up,
                    "nodes": sorted(r.nodes),
                    "body": short(r.body, 10000)} for r in (results or [])],
            }) + "\n")


# --------------------------------------------------------------------------
# main

def parse_args(argv):
    env = os.environ
    p = argparse.ArgumentParser(
        description="Retry storm against ngx_http_idempotency_module: K keys"
        " x C concurrent, retrying clients; every key must run exactly once"
        " and every client of a key must end with the same 2xx answer.")
    p.add_argument("--keys", type=int, help="keys (default 2000, "
                   "--short 200)")
    p.add_argument("--clients", type=int, help="concurrent clients per key "
                   "(default 8)")
    p.add_argument("--latency", type=parse_latency, default=(0, 200),
                   metavar="MIN:MAX", help="upstream latency range in ms "
                   "(default 0:200)")
    p.add_argument("--wait", type=parse_time, default=0, metavar="TIME",
                   help="set idempotency_wait TIME (e.g. 2s); default none")
    p.add_argument("--short", action="store_true",
                   help="quick run for the test suite: 200 keys x 8 clients")
    p.add_argument("--duration-limit", type=parse_time, default=600,
                   metavar="TIME", help="hard cap on the whole run "
                   "(default 600s)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (it is kept anyway when a "
                   "key fails) and the Redis records")
    p.add_argument("--nginx", default=env.get("TEST_NGINX_BINARY")
                   or "/usr/sbin/nginx", help="nginx binary "
                   "(env TEST_NGINX_BINARY, default /usr/sbin/nginx)")
    p.add_argument("--module", default=env.get("TEST_NGINX_LOAD_MODULES")
                   or "build/ngx_http_idempotency_module.so",
                   help="the module .so (env TEST_NGINX_LOAD_MODULES, "
                   "default build/ngx_http_idempotency_module.so; relative "
                   "paths are taken from the repository root)")
    p.add_argument("--redis-port", type=int,
                   help="use the Redis on 127.0.0.1:PORT (env "
                   "TEST_NGINX_REDIS_PORT, not used by the redis-kill and "
                   "redis-stall scenarios); default: start a private one")
    p.add_argument("--redis-directive", metavar="TEXT",
                   help="the arguments of idempotency_redis to use instead "
                   "of the generated one, e.g. '127.0.0.1:26379 "
                   "sentinel=mymaster'; no Redis is started (prefix= is "
                   "added unless TEXT has one); records are counted only "
                   "with --redis-port")
    p.add_argument("--nodes", type=int, default=1,
                   help="nginx instances sharing the Redis; the clients and "
                   "retries of each key go to all of them (default 1)")
    p.add_argument("--workers", type=int, default=2,
                   help="worker_processes of each nginx (default 2)")
    p.add_argument("--lock-ttl", type=parse_time, default=30,
                   metavar="TIME", help="idempotency_lock_ttl (default 30s)")
    p.add_argument("--redis-timeout", type=parse_time, metavar="TIME",
                   help="timeout= of idempotency_redis (default: the "
                   "module's 1s; 500ms with redis-stall)")
    p.add_argument("--store-status", metavar="TEXT",
                   help="set idempotency_store_status TEXT")
    p.add_argument("--proxy-read-timeout", type=parse_time, metavar="TIME",
                   help="proxy_read_timeout (default nginx's 60s; 1s with "
                   "upstream-reset)")
    p.add_argument("--ignore-client-abort", choices=("on", "off"),
                   help="proxy_ignore_client_abort (default nginx's off; on "
                   "with client-disconnect)")
    chaos = p.add_argument_group(
        "chaos", "faults while the storm runs (" + ", ".join(SCENARIOS) + ")")
    chaos.add_argument("--chaos", action="append", default=[],
                       metavar="NAME[,NAME]", help="scenario(s) to run "
                       "while storming; repeatable")
    chaos.add_argument("--chaos-start", type=parse_time, default=1.0,
                       metavar="TIME", help="first event after TIME of "
                       "load (default 1s)")
    chaos.add_argument("--chaos-interval", type=parse_time, default=2.0,
                       metavar="TIME", help="pause after each event "
                       "(default 2s)")
    chaos.add_argument("--chaos-events", type=int, default=2, metavar="N",
                       help="events of each event scenario (default 2)")
    chaos.add_argument("--chaos-exec", metavar="CMD",
                       help="exec: the shell command each event runs (e.g. "
                       "a Sentinel failover), with STORM_NGINX_PORTS, "
                       "STORM_NGINX_PIDS and STORM_REDIS_PORT set; it fails "
                       "the run unless it exits 0 within 120 s")
    chaos.add_argument("--no-aof", action="store_true",
                       help="redis-kill: run Redis without persistence "
                       "(shows what a restart does to claims)")
    chaos.add_argument("--appendfsync", choices=("always", "everysec",
                                                 "no"), default="always",
                       help="redis-kill: appendfsync of the AOF (default "
                       "always)")
    chaos.add_argument("--redis-down", type=parse_time, default=0.5,
                       metavar="TIME", help="redis-kill: restart after "
                       "TIME (default 500ms)")
    chaos.add_argument("--stall", type=parse_time, metavar="TIME",
                       help="redis-stall: CLIENT PAUSE length (default 4 x "
                       "the module's timeout)")
    chaos.add_argument("--fault-rate", type=float, default=0.2,
                       metavar="F", help="upstream-reset: share of "
                       "executions that break off; client-disconnect: share "
                       "of attempts that hang up (default 0.2)")
    chaos.add_argument("--upstream-fault", choices=("reset", "stall",
                                                    "both"), default="both",
                       help="upstream-reset: reset the connection, stall "
                       "past proxy_read_timeout, or either (default both)")
    chaos.add_argument("--give-up", type=parse_time, metavar="TIME",
                       help="a client gives a key up after TIME (default: "
                       "--attempts and the run's deadline only; 60%% of the "
                       "lock TTL with worker-kill)")
    chaos.add_argument("--min-resolved", type=float, default=50.0,
                       metavar="PCT", help="under chaos, fail the run when "
                       "fewer than PCT %% of the keys were answered to "
                       "every client (default 50)")
    p.add_argument("--threads", type=int, default=64,
                   help="client threads in all (default 64, at most %d); "
                   "they form threads/clients lanes" % MAX_THREADS)
    p.add_argument("--attempts", type=int, default=50,
                   help="attempts per client before it gives up (default 50)")
    p.add_argument("--fresh-connections", action="store_true",
                   help="a new connection per request (default keep-alive)")
    p.add_argument("--workdir", help="work directory (default "
                   "build/storm/<pid>)")
    p.add_argument("--report", metavar="FILE", help="write one JSON line "
                   "per key (executions, every client's answer) to FILE")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print one line per key")
    o = p.parse_args(argv)
    if o.keys is None:
        o.keys = 200 if o.short else 2000
    if o.clients is None:
        o.clients = 8
    if o.keys < 1 or o.clients < 1 or o.attempts < 1 or o.threads < 1:
        p.error("--keys, --clients, --attempts and --threads must be >= 1")
    if o.clients > MAX_THREADS:
        p.error("--clients is at most %d" % MAX_THREADS)
    if o.duration_limit <= 0:
        p.error("--duration-limit must be positive")
    if o.nodes < 1 or o.workers < 1 or o.chaos_events < 1:
        p.error("--nodes, --workers and --chaos-events must be >= 1")
    if not 0 <= o.fault_rate <= 1:
        p.error("--fault-rate is between 0 and 1")
    o.chaos = [n.strip() for v in o.chaos for n in v.split(",") if n.strip()]
    for n in o.chaos:
        if n not in SCENARIOS:
            p.error("unknown --chaos %r (one of %s)" % (n,
                                                       ", ".join(SCENARIOS)))
    o.chaos = [n for n in SCENARIOS if n in o.chaos]
    if ("exec" in o.chaos) != bool(o.chaos_exec):
        p.error("--chaos exec and --chaos-exec CMD go together")
    own_redis = [n for n in o.chaos if n in ("redis-kill", "redis-stall")]
    if own_redis and (o.redis_port or o.redis_directive):
        p.error("--chaos %s needs the storm's own Redis: drop --redis-port "
                "and --redis-directive" % own_redis[0])
    if o.redis_port is None and not own_redis and not o.redis_directive \
            and env.get("TEST_NGINX_REDIS_PORT"):
        o.redis_port = int(env["TEST_NGINX_REDIS_PORT"])
    if "redis-stall" in o.chaos and o.redis_timeout is None:
        o.redis_timeout = 0.5
    if o.stall is None:
        o.stall = 4 * (o.redis_timeout or 1.0)
    if "upstream-reset" in o.chaos:
        if o.proxy_read_timeout is None:
            o.proxy_read_timeout = 1.0
        o.fault_modes = ("reset", "stall") if o.upstream_fault == "both" \
            else (o.upstream_fault,)
    else:
        o.fault_modes = ()
    if "client-disconnect" in o.chaos:
        if o.ignore_client_abort is None:
            o.ignore_client_abort = "on"
        o.hangup_rate = o.fault_rate
        # hang up before most answers: within the upstream's latency
        o.hangup_after = max(0.01, o.latency[1] / 1000.0 * 0.5)
    else:
        o.hangup_rate = 0.0
    if "worker-kill" in o.chaos and o.give_up is None:
        o.give_up = 0.6 * o.lock_ttl
    return o


def on_sigterm(signum, frame):
    raise Interrupted()


def nginx_extra(opts):
    """Location directives beyond the fixed ones, from the options."""
    lines = []
    if opts.wait:
        lines.append("idempotency_wait %s;" % nginx_time(opts.wait))
    if opts.store_status:
        lines.append("idempotency_store_status %s;" % opts.store_status)
    if opts.proxy_read_timeout:
        lines.append("proxy_read_timeout %s;"
                     % nginx_time(opts.proxy_read_timeout))
    if opts.ignore_client_abort:
        lines.append("proxy_ignore_client_abort %s;"
                     % opts.ignore_client_abort)
    return "".join("            %s\n" % l for l in lines)


def redis_directive(opts, redis_port, prefix):
    if opts.redis_directive:
        text = opts.redis_directive.strip().rstrip(";")
    else:
        text = "127.0.0.1:%d" % redis_port
    if "prefix=" not in text:
        text += " prefix=%s" % prefix
    if opts.redis_timeout and "timeout=" not in text.replace(
            "connect_timeout=", ""):
        text += " timeout=%s" % nginx_time(opts.redis_timeout)
    return text


def main(argv):
    opts = parse_args(argv)
    t_start = time.monotonic()
    hard_end = t_start + opts.duration_limit
    run_id = uuid.uuid4().hex[:10]
    prefix = "storm:%s:" % run_id
    module = opts.module if os.path.isabs(opts.module) \
        else os.path.join(ROOT, opts.module)
    workdir = os.path.abspath(opts.workdir) if opts.workdir \
        else os.path.join(ROOT, "build", "storm", str(os.getpid()))
    signal.signal(signal.SIGTERM, on_sigterm)

    nginxes = []
    redis = upstream = storm = chaos = None
    failed_keys = None
    interrupted = False
    used_redis_port = None
    remove_workdir = False
    try:
        try:
            if not os.path.isfile(module):
                raise SetupError("module %s not found (run make, or give "
                                 "--module / TEST_NGINX_LOAD_MODULES)"
                                 % module)
            binary = opts.nginx if os.sep in opts.nginx \
                else shutil.which(opts.nginx)
            if not binary or not os.access(binary, os.X_OK):
                raise SetupError("nginx binary %s not found (--nginx / "
                                 "TEST_NGINX_BINARY)" % opts.nginx)
            os.makedirs(workdir, exist_ok=True)

            upstream = Upstream(opts.latency,           # bound, not serving
                                opts.fault_rate if opts.fault_modes else 0,
                                opts.fault_modes,
                                (opts.proxy_read_timeout or 60) + 0.5)
            if opts.redis_port:
                used_redis_port = opts.redis_port
                redis_ping(used_redis_port, 5)
            elif not opts.redis_directive:
                redis = PrivateRedis(os.path.join(workdir, "redis"),
                                     aof=opts.appendfsync
                                     if "redis-kill" in opts.chaos
                                     and not opts.no_aof else None)
                redis.start()
                used_redis_port = redis.port
                redis_ping(used_redis_port, 10)
            directive = redis_directive(opts, used_redis_port, prefix)
            m = re.search(r"(?:^|\s)prefix=(\S+)", directive)
            prefix = m.group(1)         # a --redis-directive may set its own
            extra = nginx_extra(opts)
            for n in range(opts.nodes):
                d = workdir if opts.nodes == 1 \
                    else os.path.join(workdir, "node%d" % n)
                nginxes.append(Nginx(binary, module, d, n, opts.workers))
                nginxes[-1].start(run_id, directive, upstream.port, extra,
                                  opts.lock_ttl)
            upstream.start()
            warm_up([ng.port for ng in nginxes], run_id, hard_end)
        except SetupError as e:
            print("storm: %s" % e, file=sys.stderr)
            if nginxes and os.path.exists(nginxes[0].error_log()):
                print("storm: work directory kept: %s" % workdir,
                      file=sys.stderr)
            else:
                remove_workdir = True       # nothing worth keeping in it
            print("0 passed, %d failed" % opts.keys)
            return 2

        print("storm: run %s: %d keys x %d clients, latency %d:%d ms%s, "
              "nginx %s (%d workers each), redis %s (%s), upstream :%d, "
              "work dir %s" % (run_id, opts.keys, opts.clients,
                               opts.latency[0], opts.latency[1],
                               ", idempotency_wait %s" % nginx_time(opts.wait)
                               if opts.wait else "",
                               " ".join(":%d" % ng.port for ng in nginxes),
                               opts.workers,
                               ":%d" % used_redis_port if used_redis_port
                               else "-",
                               "given directive" if opts.redis_directive
                               else ("private, AOF appendfsync %s"
                                     % redis.aof if redis.aof
                                     else "private")
                               if redis else "given",
                               upstream.port, workdir), flush=True)
        print("storm: idempotency_redis %s; idempotency_lock_ttl %s"
              % (directive, nginx_time(opts.lock_ttl)), flush=True)
        if extra:
            print("storm: " + " ".join(extra.split()), flush=True)
        if opts.chaos:
            print("storm: chaos %s%s" % (
                ", ".join(opts.chaos),
                "; clients give a key up after %s" % nginx_time(opts.give_up)
                if opts.give_up else ""), flush=True)

        # Keys start until load_deadline; keys already started may retry
        # for half the margin more; the rest is for tearing down, all inside
        # --duration-limit.
        margin = min(30.0, max(4.0, opts.duration_limit * 0.1))
        load_deadline = max(time.monotonic() + 1, hard_end - margin)
        retry_deadline = load_deadline + margin / 2
        storm = Storm(opts, [ng.port for ng in nginxes], run_id,
                      load_deadline, retry_deadline)
        chaos = Chaos(opts, storm, nginxes, redis, used_redis_port)
        t_load = time.monotonic()
        storm.run()
        chaos.start(t_load)
        try:
            last_note = time.monotonic()
            while not storm.join(0.5):
                now = time.monotonic()
                if now > retry_deadline + storm.timeout + 2:
                    print("storm: client threads still busy after the "
                          "deadline; judging what is there", flush=True)
                    storm.stop.set()
                    break
                if now - last_note >= 10:
                    last_note = now
                    print("storm: %d/%d keys started, %.0fs"
                          % (storm.progress(), opts.keys, now - t_load),
                          flush=True)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
            print("storm: interrupted, stopping the clients", flush=True)
            storm.stop.set()
            storm.join(storm.timeout + 2)
        elapsed = time.monotonic() - t_load
        chaos.quiesce(30)

        # a second execution could still be running upstream: let it finish
        upstream.wait_idle(opts.latency[1] / 1000.0 + 3
                           + (upstream.stall if opts.fault_modes else 0))
        executions, meta = upstream.snapshot()
        executions.pop("storm-%s-warmup" % run_id, None)
        for ng in nginxes:
            ng.stop()                   # graceful: logs are complete now
        levels, samples, idem, by_pid, http_status, log_events = read_logs(
            [ng.dir for ng in nginxes])
        records = None
        if used_redis_port:
            try:
                records = redis_scan(used_redis_port,
                                     "%s*:storm-%s-*" % (prefix, run_id),
                                     delete=not opts.keep and redis is None)
            except OSError as e:
                print("storm: cannot count records in Redis: %s" % e)

        lenient = bool(opts.chaos)
        verdicts = judge(storm, executions, meta, lenient)
        failed_keys = [v for v in verdicts if v[1]]
        passed = len(verdicts) - len(failed_keys)
        if opts.report:
            write_report(opts.report, verdicts)

        stats = collections.Counter()
        for s in storm.stats:
            stats.update(s)
        finals = [r for v in verdicts for r in (v[3] or []) if r is not None]
        ok = [r for r in finals if r.ok()]
        replayed = sum(1 for r in ok if r.replayed)
        times = sorted(r.elapsed for r in finals)
        total_exec = sum(len(executions.get(k, [])) for k in storm.keys)
        duplicates = sum(1 for k in storm.keys
                         if len(executions.get(k, [])) > 1)
        never = sum(1 for v in verdicts if v[3] is not None and not v[2])
        divergent = sum(1 for v in verdicts
                        if any(p.startswith("DIVERGENT") for p in v[1]))
        no_2xx = sum(1 for r in finals if not r.ok())
        gave_up = sum(1 for r in finals if r.gave_up)
        outcomes = collections.Counter(v[4] for v in verdicts)
        fresh_per_key = collections.Counter(
            sum(1 for r in (v[3] or []) if r is not None and r.ok()
                and not r.replayed) for v in verdicts if v[3] is not None)
        strays = {k: len(v) for k, v in executions.items()
                  if k not in set(storm.keys)}
        by_worker = collections.Counter(
            w for k in storm.keys for w, _ in meta.get(k, []))
        killed = set(chaos.killed)
        orphaned = sum(1 for v in verdicts
                       if v[4] in ("unresolved-ran", "partly")
                       and any(w in killed for w, _ in meta.get(v[0], [])))
        spread = collections.Counter(
            len(set().union(*[r.nodes for r in (v[3] or [])
                              if r is not None]))
            for v in verdicts if v[3] is not None) if opts.nodes > 1 \
            else None

        if opts.verbose:
            for key, problems, runs, results, outcome in verdicts:
                print("%s exec=%d %s %s" % (
                    key, len(runs), " ".join(
                        "-" if r is None else "%s%s%s/%d" % (
                            r.status or "net", "r" if r.replayed else "",
                            "?" if r.gave_up else "",
                            r.attempts) for r in (results or [])),
                    outcome if not problems
                    else "FAIL: " + "; ".join(problems)))

        shown = [v for v in failed_keys if v[3] is not None]
        for key, problems, runs, results, _ in shown[:20]:
            print("FAIL %s: %s" % (key, "; ".join(problems)))
            for n, body in enumerate(runs):
                w, fault = (meta.get(key) or [("-", None)] * len(runs))[n]
                print("    execution %d (%s%s): %s" % (
                    n + 1, w, ", then " + fault if fault else "",
                    short(body).strip()))
            for j, r in enumerate(results or []):
                if r is None:
                    print("    client %d: -" % j)
                else:
                    print("    client %d: %s%s%s after %d attempts [%s] "
                          "%.2fs body %s%s" % (
                              j, r.status or "no response",
                              " (replayed)" if r.replayed else "",
                              " (gave up)" if r.gave_up else "",
                              r.attempts, " ".join(r.history), r.elapsed,
                              short(r.body, 200).strip(),
                              " error: " + r.error if r.error else ""))
        if len(shown) > 20:
            print("... and %d more failed keys" % (len(shown) - 20))

        print("---- storm summary (run %s)" % run_id)
        print("keys:               %d x %d clients%s%s"
              % (opts.keys, opts.clients,
                 " (%d not started)" % (opts.keys - storm.started)
                 if storm.started < opts.keys else "",
                 ", %d nginx nodes" % opts.nodes if opts.nodes > 1 else ""))
        print("requests sent:      %d (%.0f/s)"
              % (stats["sent"], stats["sent"] / elapsed if elapsed else 0))
        print("retries:            %s; gave up: %d clients"
              % (", ".join("%s: %d" % (k[6:], v) for k, v in
                           sorted(stats.items()) if k.startswith("retry_"))
                 or "none", stats["gave_up"]))
        if stats["no_retry_after_409"] or stats["no_retry_after_503"] \
                or stats["bad_retry_after"]:
            print("retry-after:        missing on %d 409s, %d 503s; "
                  "unparsable %d" % (stats["no_retry_after_409"],
                                     stats["no_retry_after_503"],
                                     stats["bad_retry_after"]))
        print("executions:         %d (upstream), duplicates: %d keys, "
              "never ran: %d keys" % (total_exec, duplicates, never))
        print("divergent keys:     %d" % divergent)
        print("clients without 2xx:%s%d (%d gave up)"
              % (" ", no_2xx, gave_up))
        print("2xx answers:        %d, replayed (Idempotent-Replayed: true) "
              "%d, fresh %d" % (len(ok), replayed, len(ok) - replayed))
        print("fresh 2xx per key:  %s" % ", ".join(
            "%d keys with %d" % (v, k)
            for k, v in sorted(fresh_per_key.items())))
        if lenient:
            print("key outcomes:       %s" % fmt_counter(outcomes))
        if any(n in EVENT_SCENARIOS for n in opts.chaos):
            print("chaos:              %s" % (", ".join(
                "%s %d%s" % (n, chaos.counts()[n, True],
                             " (+%d failed)" % chaos.counts()[n, False]
                             if chaos.counts()[n, False] else "")
                for n in opts.chaos if n in EVENT_SCENARIOS) or "-"))
        if opts.fault_modes:
            print("upstream faults:    %s (after doing the work)"
                  % fmt_counter(upstream.faults))
        if opts.hangup_rate:
            print("client hang-ups:    %d before the answer, %d after it, "
                  "%d failed" % (stats["hangups_mid_request"],
                                 stats["hangups_after_answer"],
                                 stats["hangups_failed"]))
        held = [v[0] for v in verdicts if any(
            r is not None and r.elapsed >= 0.9 * opts.lock_ttl
            for r in (v[3] or []))]
        if held:
            print("long waits:         %d keys had a client busy for 90 %% "
                  "of the lock TTL or more (%s)"
                  % (len(held), " ".join(held[:5])
                     + (" ..." if len(held) > 5 else "")))
        if killed:
            print("killed workers:     %s; keys they ran and nobody got "
                  "the answer of: %d" % (" ".join(sorted(killed)), orphaned))
        print("client time:        p50 %.3fs, p99 %.3fs, max %.3fs"
              % (percentile(times, 50), percentile(times, 99),
                 times[-1] if times else 0))
        print("elapsed:            %.1fs (load), %.1fs (all)"
              % (elapsed, time.monotonic() - t_start))
        print("nginx statuses:     %s" % fmt_counter(http_status))
        print("idempotency_status: %s" % fmt_counter(idem))
        print("requests by worker: %s" % fmt_counter(by_pid))
        print("executions by worker: %s" % fmt_counter(by_worker))
        if spread is not None:
            print("nodes per key:      %s" % ", ".join(
                "%d keys on %d nodes" % (v, k)
                for k, v in sorted(spread.items())))
        if records is not None:
            print("redis records:      %d under %s (%d keys + warm-up)"
                  % (records, prefix, opts.keys))
        if upstream.others or upstream.key_mismatch or strays:
            print("upstream oddities:  %d non-POST, %d key header/body "
                  "mismatches, executions of unknown keys %s"
                  % (upstream.others, upstream.key_mismatch, strays or "-"))
        if log_events:
            print("module log:         %s" % fmt_counter(log_events))
        print("error.log:          %s"
              % (fmt_counter(levels) if levels else "no [warn] or worse"))
        for level in ("emerg", "alert", "crit", "error", "warn"):
            for line in samples.get(level, []):
                print("    " + line)

        run_problems = []
        if opts.chaos and not interrupted:
            for n in opts.chaos:
                if n in EVENT_SCENARIOS and not chaos.counts()[n, True]:
                    run_problems.append("chaos %s did not happen" % n)
                if chaos.counts()[n, False]:
                    run_problems.append("chaos %s failed %d times"
                                        % (n, chaos.counts()[n, False]))
            if opts.fault_modes and not sum(upstream.faults.values()):
                run_problems.append("the upstream broke off nothing")
            if opts.hangup_rate and not stats["hangups_mid_request"]:
                run_problems.append("no client hung up mid-request")
            resolved = outcomes["ok"] + outcomes["stored-error"]
            if resolved * 100.0 < opts.min_resolved * len(verdicts):
                run_problems.append("only %d of %d keys answered to every "
                                    "client (--min-resolved %g%%)"
                                    % (resolved, len(verdicts),
                                       opts.min_resolved))
        if opts.nodes > 1 and not interrupted and not any(
                k > 1 for k in spread):
            run_problems.append("no key's clients reached two nodes")
        for problem in run_problems:
            print("storm: FAILED: %s" % problem)
        if interrupted:
            print("storm: interrupted")
        if failed_keys or run_problems:
            print("storm: work directory kept: %s" % workdir)
        exit_code = 130 if interrupted \
            else 1 if failed_keys or run_problems else 0
        remove_workdir = exit_code == 0
        print("%d passed, %d failed" % (passed, len(failed_keys)))
        return exit_code
    except (KeyboardInterrupt, Interrupted):
        print("storm: interrupted")
        print("0 passed, %d failed" % opts.keys)
        return 130
    finally:
        if chaos is not None:
            chaos.finish(15)
        if storm is not None:
            storm.stop.set()
        for ng in nginxes:
            ng.stop()
        if upstream is not None:
            upstream.stop()
        if redis is not None:
            redis.stop()
        if remove_workdir and not opts.keep and not opts.workdir \
                and os.path.isdir(workdir):
            shutil.rmtree(workdir, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(workdir))   # build/storm if empty
            except OSError:
                pass


def _post_until_final(port, body, headers, end):
    """POST until an answer that is not 409/503/a network error, or `end`;
    returns every (status, Idempotent-Replayed, body) seen."""
    answers = []
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                c.request("POST", "/orders", body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
            finally:
                c.close()
            answers.append((r.status, r.getheader("Idempotent-Replayed"),
                            data))
            if r.status not in RETRY_STATUSES:
                return answers
        except (OSError, http.client.HTTPException) as e:
            answers.append((None, None, repr(e)))
        if time.monotonic() >= end:
            return answers
        time.sleep(0.1)


def warm_up(ports, run_id, hard_end):
    """One key end to end before the storm: a 201 from the upstream through
    the first node (503s while the workers connect to Redis are retried),
    then its replay through every node (a 409 is retried too: the client
    can have the 201 before its record is stored)."""
    key = "storm-%s-warmup" % run_id
    body = json.dumps({"key": key, "warmup": True}).encode()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    end = min(time.monotonic() + 15, hard_end)

    def last(answers):
        return "; ".join("%s %s" % (s or "error", short(d, 200))
                         for s, _, d in answers[-3:])

    answers = _post_until_final(ports[0], body, headers, end)
    status, _, first = answers[-1]
    if status != 201:
        raise SetupError("warm-up POST did not get 201 from the upstream; "
                         "last answers: %s" % last(answers))
    for port in ports:
        answers = _post_until_final(port, body, headers,
                                    min(time.monotonic() + 10, hard_end))
        status, replayed, data = answers[-1]
        if status != 201 or data != first \
                or (replayed or "").strip().lower() != "true":
            raise SetupError("warm-up: a second POST (to :%d) was not a "
                             "replay of the first (Idempotent-Replayed: %s);"
                             " last answers: %s"
                             % (port, replayed, last(answers)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
