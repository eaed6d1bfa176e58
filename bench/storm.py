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

Python 3 standard library only.  Run from anywhere:
    python3 bench/storm.py --short
    python3 bench/storm.py                      # 2000 keys x 8 clients
    python3 bench/storm.py --wait 5s --keys 500
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
    of its own."""

    def __init__(self, latency_ms):
        self.latency = latency_ms
        self.lock = threading.Lock()
        self.executions = collections.defaultdict(list)   # key -> [bytes]
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
                try:
                    body_key = json.loads(payload.decode()).get("key")
                except Exception:
                    body_key = None
                if key is None:
                    key = body_key if body_key is not None else ""
                with upstream.lock:
                    if body_key is not None and body_key != key:
                        upstream.key_mismatch += 1
                    runs = upstream.executions[key]
                    n = len(runs) + 1
                    body = json.dumps({"key": key,
                                       "execution_id": str(uuid.uuid4()),
                                       "n": n}).encode() + b"\n"
                    runs.append(body)
                    upstream.inflight += 1
                try:
                    lo, hi = upstream.latency
                    time.sleep(random.uniform(lo, hi) / 1000.0)
                    self.send_response(201)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Location", "/orders/%s" % key)
                    self.end_headers()
                    self.wfile.write(body)
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
            return {k: list(v) for k, v in self.executions.items()}


# --------------------------------------------------------------------------
# nginx and redis

NGINX_CONF = """\
# written by bench/storm.py (run {run_id}); this directory is the -p prefix
load_module {module};

daemon           off;
master_process   on;
worker_processes 2;
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
        # reuseport: the kernel spreads connections over both workers
        listen 127.0.0.1:{port} reuseport;

        location / {{
            idempotency on;
            idempotency_redis 127.0.0.1:{redis_port} prefix={prefix};
            idempotency_lock_ttl 30s;
{extra}            proxy_pass http://127.0.0.1:{upstream_port};
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, binary, module, workdir):
        self.binary = binary
        self.module = module
        self.dir = workdir
        self.proc = None
        self.port = None
        self.workers = []

    def conf_path(self):
        return os.path.join(self.dir, "nginx.conf")

    def error_log(self):
        return os.path.join(self.dir, "error.log")

    def start(self, run_id, redis_port, prefix, upstream_port, wait):
        for d in ("tmp", "logs"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        extra = ""
        if wait:
            extra = "            idempotency_wait %s;\n" % nginx_time(wait)
        last = "nginx did not start"
        for _ in range(3):             # a free port can be taken meanwhile
            self.port = free_port()
            with open(self.conf_path(), "w") as f:
                f.write(NGINX_CONF.format(run_id=run_id, module=self.module,
                                          dir=self.dir, port=self.port,
                                          redis_port=redis_port,
                                          prefix=prefix, extra=extra,
                                          upstream_port=upstream_port))
            self.proc = start_process(
                [self.binary, "-p", self.dir + "/", "-c", self.conf_path(),
                 "-e", self.error_log()],
                os.path.join(self.dir, "nginx.stderr"), signal.SIGTERM)
            if wait_port(self.port, 10, self.proc):
                self.workers = self._wait_workers(2, 5)
                return
            last = self._tail_errors()
            self.stop()
        raise SetupError("nginx did not start:\n" + last)

    def _wait_workers(self, n, seconds):
        end = time.monotonic() + seconds
        kids = []
        while time.monotonic() < end:
            kids = children_of(self.proc.pid)
            if len(kids) >= n:
                break
            time.sleep(0.05)
        return kids

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
        workers = children_of(self.proc.pid) if self.proc.poll() is None \
            else []
        known = {pid: start for pid, start in self.workers + workers}
        stop_process(self.proc, signal.SIGQUIT, 10)
        for pid, start in known.items():
            st = _proc_stat(pid)
            if st is not None and st[1] == start:     # same process still
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc = None


class PrivateRedis:
    def __init__(self, workdir):
        self.dir = workdir
        self.proc = None
        self.port = None

    def start(self, binary="redis-server"):
        if shutil.which(binary) is None:
            raise SetupError("redis-server not found: install it, or give "
                             "--redis-port of a running Redis")
        os.makedirs(self.dir, exist_ok=True)
        for _ in range(3):
            self.port = free_port()
            self.proc = start_process(
                [binary, "--bind", "127.0.0.1", "--port", str(self.port),
                 "--save", "", "--appendonly", "no", "--dir", self.dir,
                 "--daemonize", "no"],
                os.path.join(self.dir, "redis.log"), signal.SIGTERM)
            if wait_port(self.port, 10, self.proc):
                return
            self.stop()
        raise SetupError("redis-server did not start (see %s/redis.log)"
                         % self.dir)

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
                 "history", "elapsed", "error")

    def __init__(self):
        self.status = None
        self.body = None
        self.ctype = None
        self.replayed = False
        self.attempts = 0
        self.history = []       # one token per attempt: 201, 201r, 409, net
        self.elapsed = 0.0
        self.error = None

    def ok(self):
        return self.status is not None and 200 <= self.status < 300


class Client:
    """One simulated client: its own connection to nginx, reused (keep-alive)
    unless --fresh-connections, reopened after any error."""

    def __init__(self, port, timeout, opts, stop, stats):
        self.port = port
        self.timeout = timeout
        self.opts = opts
        self.stop = stop
        self.stats = stats          # this thread's Counter
        self.conn = None

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    def backoff(self, attempt, retry_after):
        cap = 0.2 * attempt
        if retry_after is not None:
            base = retry_after
        else:
            base = 0.05 * (2 ** min(attempt, 8))
        return min(base, cap) * random.uniform(0.5, 1.0)

    def post(self, key, body, deadline):
        res = Result()
        t0 = time.monotonic()
        headers = {"Idempotency-Key": key,
                   "Content-Type": "application/json"}
        for attempt in range(1, self.opts.attempts + 1):
            res.attempts = attempt
            self.stats["sent"] += 1
            retry_after = None
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(
                        "127.0.0.1", self.port, timeout=self.timeout)
                self.conn.request("POST", "/orders", body=body,
                                  headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                status = resp.status
                if resp.will_close or self.opts.fresh_connections:
                    self.close()
            except (OSError, http.client.HTTPException) as e:
                self.close()
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
                res.history.append("%d%s" % (status, "r" if replayed else ""))
                if status not in RETRY_STATUSES:
                    break
                reason = str(status)
                ra = resp.getheader("Retry-After")
                if ra is None:
                    self.stats["no_retry_after_%d" % status] += 1
                else:
                    try:
                        retry_after = max(0.0, float(ra.strip()))
                    except ValueError:
                        self.stats["bad_retry_after"] += 1
            if attempt == self.opts.attempts or self.stop.is_set() \
                    or time.monotonic() >= deadline:
                self.stats["gave_up"] += 1
                break
            self.stats["retry_" + reason] += 1
            delay = self.backoff(attempt, retry_after)
            delay = min(delay, max(0.0, deadline - time.monotonic()))
            if self.stop.wait(delay):
                self.stats["gave_up"] += 1
                break
        res.elapsed = time.monotonic() - t0
        return res


class Storm:
    """K keys, C clients each; lanes of C threads take one key at a time,
    the C threads of a lane meet at a barrier so that they collide."""

    def __init__(self, opts, port, run_id, deadline, retry_deadline):
        self.opts = opts
        self.port = port
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
        client = Client(self.port, self.timeout, self.opts, self.stop, stats)
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

    def progress(self):
        with self.index_lock:
            return self.started


# --------------------------------------------------------------------------
# report

def judge(storm, executions):
    """Verdict per key: list of (key, problems, info)."""
    verdicts = []
    for i, key in enumerate(storm.keys):
        runs = executions.get(key, [])
        results = storm.results[i]
        problems = []
        if results is None:
            problems.append("not started (deadline or interrupt)")
            verdicts.append((key, problems, runs, results))
            continue
        if len(runs) == 0:
            problems.append("never ran upstream")
        elif len(runs) > 1:
            problems.append("DUPLICATE: ran %d times upstream" % len(runs))
        for j, r in enumerate(results):
            if r is None:
                problems.append("client %d: no result (did not finish)" % j)
            elif not r.ok():
                problems.append("client %d: ended with %s after %d "
                                "attempts [%s]%s"
                                % (j, r.status if r.status else "no response",
                                   r.attempts, " ".join(r.history),
                                   ": " + r.error if r.error else ""))
        finals = set((r.status, r.body) for r in results
                     if r is not None and r.ok())
        if len(finals) > 1:
            problems.append("DIVERGENT: %d different (status, body) pairs"
                            % len(finals))
        elif len(finals) == 1 and runs:
            status, body = next(iter(finals))
            if body not in runs:
                problems.append("DIVERGENT: body is none of the upstream's "
                                "responses")
            elif body != runs[0] and len(runs) > 1:
                problems.append("body is from execution %d, not the first"
                                % (runs.index(body) + 1))
            if status != 201:
                problems.append("status %d, the upstream answered 201"
                                % status)
        ctypes = set(r.ctype for r in results if r is not None and r.ok())
        if ctypes and ctypes != {"application/json"}:
            problems.append("DIVERGENT: Content-Type %s"
                            % ", ".join(sorted(map(str, ctypes))))
        verdicts.append((key, problems, runs, results))
    return verdicts


def read_logs(workdir):
    levels = collections.Counter()
    samples = collections.defaultdict(list)
    pattern = re.compile(r"\[(emerg|alert|crit|error|warn)\]")
    try:
        with open(os.path.join(workdir, "error.log"), "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace").rstrip()
                m = pattern.search(line)
                if m:
                    levels[m.group(1)] += 1
                    if len(samples[m.group(1)]) < 8:
                        samples[m.group(1)].append(line)
    except OSError:
        pass
    idem = collections.Counter()
    by_pid = collections.Counter()
    status = collections.Counter()
    try:
        with open(os.path.join(workdir, "access.log"), "rb") as f:
            for raw in f:
                parts = raw.decode("utf-8", "replace").split()
                if len(parts) >= 3:
                    by_pid[parts[0]] += 1
                    status[parts[1]] += 1
                    idem[parts[2]] += 1
    except OSError:
        pass
    return levels, samples, idem, by_pid, status


def fmt_counter(c):
    return ", ".join("%s %d" % (k, v) for k, v in
                     sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def write_report(path, verdicts):
    with open(path, "w") as f:
        for key, problems, runs, results in verdicts:
            f.write(json.dumps({
                "key": key, "passed": not problems, "problems": problems,
                "executions": [short(b, 10000) for b in runs],
                "clients": [None if r is None else {
                    "status": r.status, "replayed": r.replayed,
                    "attempts": r.attempts, "history": r.history,
                    "elapsed": round(r.elapsed, 4), "error": r.error,
                    "content_type": r.ctype,
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
                   default=int(env["TEST_NGINX_REDIS_PORT"])
                   if env.get("TEST_NGINX_REDIS_PORT") else None,
                   help="use the Redis on 127.0.0.1:PORT (env "
                   "TEST_NGINX_REDIS_PORT); default: start a private one")
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
    return o


def on_sigterm(signum, frame):
    raise Interrupted()


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

    nginx = redis = upstream = storm = None
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

            upstream = Upstream(opts.latency)          # bound, not serving
            if opts.redis_port:
                used_redis_port = opts.redis_port
                redis_ping(used_redis_port, 5)
            else:
                redis = PrivateRedis(os.path.join(workdir, "redis"))
                redis.start()
                used_redis_port = redis.port
                redis_ping(used_redis_port, 10)
            nginx = Nginx(binary, module, workdir)
            nginx.start(run_id, used_redis_port, prefix, upstream.port,
                        opts.wait)
            upstream.start()
            warm_up(nginx.port, run_id, hard_end)
        except SetupError as e:
            print("storm: %s" % e, file=sys.stderr)
            if nginx is not None and os.path.exists(nginx.error_log()):
                print("storm: work directory kept: %s" % workdir,
                      file=sys.stderr)
            else:
                remove_workdir = True       # nothing worth keeping in it
            print("0 passed, %d failed" % opts.keys)
            return 2

        print("storm: run %s: %d keys x %d clients, latency %d:%d ms%s, "
              "nginx :%d (2 workers), redis :%d (%s), upstream :%d, "
              "work dir %s" % (run_id, opts.keys, opts.clients,
                               opts.latency[0], opts.latency[1],
                               ", idempotency_wait %s" % nginx_time(opts.wait)
                               if opts.wait else "",
                               nginx.port, used_redis_port,
                               "private" if redis else "given",
                               upstream.port, workdir), flush=True)

        # Keys start until load_deadline; keys already started may retry
        # for half the margin more; the rest is for tearing down, all inside
        # --duration-limit.
        margin = min(30.0, max(4.0, opts.duration_limit * 0.1))
        load_deadline = max(time.monotonic() + 1, hard_end - margin)
        retry_deadline = load_deadline + margin / 2
        storm = Storm(opts, nginx.port, run_id, load_deadline,
                      retry_deadline)
        t_load = time.monotonic()
        storm.run()
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

        # a second execution could still be running upstream: let it finish
        upstream.wait_idle(opts.latency[1] / 1000.0 + 3)
        executions = upstream.snapshot()
        executions.pop("storm-%s-warmup" % run_id, None)
        nginx.stop()                    # graceful: logs are complete now
        levels, samples, idem, by_pid, http_status = read_logs(workdir)
        records = None
        try:
            records = redis_scan(used_redis_port, prefix + "*",
                                 delete=not opts.keep and redis is None)
        except OSError as e:
            print("storm: cannot count records in Redis: %s" % e)

        verdicts = judge(storm, executions)
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
        fresh_per_key = collections.Counter(
            sum(1 for r in (v[3] or []) if r is not None and r.ok()
                and not r.replayed) for v in verdicts if v[3] is not None)
        strays = {k: len(v) for k, v in executions.items()
                  if k not in set(storm.keys)}

        if opts.verbose:
            for key, problems, runs, results in verdicts:
                print("%s exec=%d %s %s" % (
                    key, len(runs), " ".join(
                        "-" if r is None else "%s%s/%d" % (
                            r.status or "net", "r" if r.replayed else "",
                            r.attempts) for r in (results or [])),
                    "ok" if not problems else "FAIL: " + "; ".join(problems)))

        shown = [v for v in failed_keys if v[3] is not None]
        for key, problems, runs, results in shown[:20]:
            print("FAIL %s: %s" % (key, "; ".join(problems)))
            for n, body in enumerate(runs):
                print("    execution %d: %s" % (n + 1, short(body).strip()))
            for j, r in enumerate(results or []):
                if r is None:
                    print("    client %d: -" % j)
                else:
                    print("    client %d: %s%s after %d attempts [%s] %.2fs "
                          "body %s%s" % (
                              j, r.status or "no response",
                              " (replayed)" if r.replayed else "",
                              r.attempts, " ".join(r.history), r.elapsed,
                              short(r.body, 200).strip(),
                              " error: " + r.error if r.error else ""))
        if len(shown) > 20:
            print("... and %d more failed keys" % (len(shown) - 20))

        print("---- storm summary (run %s)" % run_id)
        print("keys:               %d x %d clients%s"
              % (opts.keys, opts.clients,
                 " (%d not started)" % (opts.keys - storm.started)
                 if storm.started < opts.keys else ""))
        print("requests sent:      %d (%.0f/s)"
              % (stats["sent"], stats["sent"] / elapsed if elapsed else 0))
        print("retries:            409: %d, 503: %d, network: %d; gave up: %d"
              % (stats["retry_409"], stats["retry_503"],
                 stats["retry_network"], stats["gave_up"]))
        if stats["no_retry_after_409"] or stats["no_retry_after_503"] \
                or stats["bad_retry_after"]:
            print("retry-after:        missing on %d 409s, %d 503s; "
                  "unparsable %d" % (stats["no_retry_after_409"],
                                     stats["no_retry_after_503"],
                                     stats["bad_retry_after"]))
        print("executions:         %d (upstream), duplicates: %d keys, "
              "never ran: %d keys" % (total_exec, duplicates, never))
        print("divergent keys:     %d" % divergent)
        print("clients without 2xx:%s%d" % (" ", no_2xx))
        print("2xx answers:        %d, replayed (Idempotent-Replayed: true) "
              "%d, fresh %d" % (len(ok), replayed, len(ok) - replayed))
        print("fresh 2xx per key:  %s" % ", ".join(
            "%d keys with %d" % (v, k)
            for k, v in sorted(fresh_per_key.items())))
        print("client time:        p50 %.3fs, p99 %.3fs, max %.3fs"
              % (percentile(times, 50), percentile(times, 99),
                 times[-1] if times else 0))
        print("elapsed:            %.1fs (load), %.1fs (all)"
              % (elapsed, time.monotonic() - t_start))
        print("nginx statuses:     %s" % fmt_counter(http_status))
        print("idempotency_status: %s" % fmt_counter(idem))
        print("requests by worker: %s" % fmt_counter(by_pid))
        if records is not None:
            print("redis records:      %d under %s (%d keys + warm-up)"
                  % (records, prefix, opts.keys))
        if upstream.others or upstream.key_mismatch or strays:
            print("upstream oddities:  %d non-POST, %d key header/body "
                  "mismatches, executions of unknown keys %s"
                  % (upstream.others, upstream.key_mismatch, strays or "-"))
        print("error.log:          %s"
              % (fmt_counter(levels) if levels else "no [warn] or worse"))
        for level in ("emerg", "alert", "crit", "error", "warn"):
            for line in samples.get(level, []):
                print("    " + line)
        if interrupted:
            print("storm: interrupted")
        if failed_keys:
            print("storm: work directory kept: %s" % workdir)
        exit_code = 130 if interrupted else 1 if failed_keys else 0
        remove_workdir = exit_code == 0
        print("%d passed, %d failed" % (passed, len(failed_keys)))
        return exit_code
    except (KeyboardInterrupt, Interrupted):
        print("storm: interrupted")
        print("0 passed, %d failed" % opts.keys)
        return 130
    finally:
        if storm is not None:
            storm.stop.set()
        if nginx is not None:
            nginx.stop()
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


def warm_up(port, run_id, hard_end):
    """One key end to end before the storm: a 201 from the upstream (503s
    while the workers connect to Redis are retried), then its replay (a 409
    is retried too: the client can have the 201 before its record is
    stored)."""
    key = "storm-%s-warmup" % run_id
    body = json.dumps({"key": key, "warmup": True}).encode()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    end = min(time.monotonic() + 15, hard_end)

    def last(answers):
        return "; ".join("%s %s" % (s or "error", short(d, 200))
                         for s, _, d in answers[-3:])

    answers = _post_until_final(port, body, headers, end)
    status, _, first = answers[-1]
    if status != 201:
        raise SetupError("warm-up POST did not get 201 from the upstream; "
                         "last answers: %s" % last(answers))
    answers = _post_until_final(port, body, headers,
                                min(time.monotonic() + 10, hard_end))
    status, replayed, data = answers[-1]
    if status != 201 or data != first \
            or (replayed or "").strip().lower() != "true":
        raise SetupError("warm-up: the second POST was not a replay of the "
                         "first (Idempotent-Replayed: %s); last answers: %s"
                         % (replayed, last(answers)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
