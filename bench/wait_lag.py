#!/usr/bin/env python3
"""How long a waiting duplicate (idempotency_wait) waits after the first
request's response: the lag from the end of the first response to the end
of the duplicate's replay.

Starts a private redis-server (or uses --redis-port), an upstream that
answers each POST after the time its ?ms= asks, and two nginx nodes
(node A with 2 workers, node B with 1) with the module, the same Redis and
prefix, and `idempotency_wait 30s` (plus --wait-args).  For each operation
length and each place of the duplicate (node A, where the first request
runs, or node B), --trials times: the first request of a fresh key goes to
node A; --delay ms later (default 50) its duplicate goes to A or B.  The
lag of each trial is the duplicate's last byte minus the first request's
last byte.  Prints the median, 90th percentile and maximum per case and
overall, and the Redis commands of the run per trial (INFO commandstats).

    python3 bench/wait_lag.py                               # this build
    python3 bench/wait_lag.py --module /path/to/other.so    # another one

Python 3 standard library only; imports storm.py's process helpers.
"""

import argparse
import http.client
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import storm  # noqa: E402

CONF = """
load_module {module};
daemon off;
master_process on;
worker_processes {workers};
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp;
    proxy_temp_path {dir}/tmp;
    idempotency_redis 127.0.0.1:{redis} prefix={prefix};
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            idempotency on;
            idempotency_scope bench;
            idempotency_wait 30s{wait_args};
            proxy_read_timeout 60s;
            proxy_pass http://127.0.0.1:{upstream};
        }}
    }}
}}
"""


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        ms = int(self.path.split("ms=", 1)[1]) if "ms=" in self.path else 0
        time.sleep(ms / 1000.0)
        body = b"done\n"
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_nginx(args, workdir, name, workers, redis_port, upstream, prefix):
    d = os.path.join(workdir, name)
    os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
    port = storm.free_port()
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(module=os.path.abspath(args.module), dir=d,
                            workers=workers, redis=redis_port,
                            prefix=prefix, port=port, upstream=upstream,
                            wait_args=args.wait_args))
    proc = storm.start_process([args.nginx, "-p", d + "/", "-c", conf,
                                "-e", os.path.join(d, "error.log")],
                               os.path.join(d, "stderr.log"),
                               signal.SIGTERM)
    if not storm.wait_port(port, 10, proc):
        raise storm.SetupError("nginx %s did not start (see %s)" % (name, d))
    return proc, port


def post(port, path, key, out, slot):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=b"x", headers={"Idempotency-Key": key})
    r = c.getresponse()
    r.read()
    out[slot] = (time.monotonic(), r.status,
                 r.getheader("Idempotent-Replayed") == "true")
    c.close()


def commandstats(port):
    r = storm.Redis(port)
    try:
        text = r("INFO", "commandstats")
    finally:
        r.close()
    if isinstance(text, bytes):
        text = text.decode()
    calls = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[8:].split(":", 1)
            calls[name] = int(rest.split("calls=", 1)[1].split(",", 1)[0])
    return calls


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--module", default=os.environ.get(
        "TEST_NGINX_LOAD_MODULES", "build/ngx_http_idempotency_module.so"))
    p.add_argument("--nginx", default=os.environ.get("TEST_NGINX_BINARY",
                                                     "/usr/sbin/nginx"))
    p.add_argument("--redis-port", type=int)
    p.add_argument("--ops", default="450,700,1300",
                   help="operation lengths, ms (default 450,700,1300)")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--delay", type=int, default=50,
                   help="ms from the first request to its duplicate")
    p.add_argument("--wait-args", default="",
                   help="more of idempotency_wait, e.g. ' poll=1s'")
    args = p.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix="wait-lag-", dir=os.path.abspath(
        "build") if os.path.isdir("build") else None)
    procs, redis = [], None
    prefix = "waitlag:%d:%d:" % (os.getpid(), int(time.time()))
    try:
        if args.redis_port:
            redis_port = args.redis_port
        else:
            redis = storm.PrivateRedis(os.path.join(workdir, "redis"))
            redis.start()
            redis_port = redis.port

        up = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
        up.daemon_threads = True
        threading.Thread(target=up.serve_forever, daemon=True).start()

        a, port_a = start_nginx(args, workdir, "a", 2, redis_port,
                                up.server_port, prefix)
        procs.append(a)
        b, port_b = start_nginx(args, workdir, "b", 1, redis_port,
                                up.server_port, prefix)
        procs.append(b)
        time.sleep(1)           # the listeners subscribe

        before = commandstats(redis_port)
        lags, n = {}, 0
        for ms in [int(x) for x in args.ops.split(",")]:
            for where, port in (("same node", port_a), ("other node", port_b)):
                case = lags.setdefault((ms, where), [])
                for i in range(args.trials):
                    key = "%s-%d-%s-%d" % (prefix, ms, where[0], i)
                    out = [None, None]
                    t1 = threading.Thread(target=post, args=(
                        port_a, "/op?ms=%d" % ms, key, out, 0))
                    t1.start()
                    time.sleep(args.delay / 1000.0)
                    post(port, "/op?ms=%d" % ms, key, out, 1)
                    t1.join()
                    first, dup = out
                    if first[1] != 201 or dup[1] != 201 or not dup[2]:
                        print("trial %s: first %s, duplicate %s (replay: %s)"
                              % (key, first[1], dup[1], dup[2]))
                        continue
                    case.append((dup[0] - first[0]) * 1000.0)
                    n += 1
        after = commandstats(redis_port)

        def fmt(v):
            v = sorted(v)
            p90 = v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
            return "%7.1f %7.1f %7.1f" % (statistics.median(v), p90, v[-1])

        print("module: %s%s" % (args.module, args.wait_args))
        print("%-6s %-11s %3s  %7s %7s %7s   (ms, duplicate's end minus "
              "the first's)" % ("op ms", "duplicate", "n", "median", "p90",
                                "max"))
        every = []
        for (ms, where), v in sorted(lags.items()):
            every += v
            if v:
                print("%-6d %-11s %3d  %s" % (ms, where, len(v), fmt(v)))
        if every:
            print("%-18s %3d  %s" % ("all", len(every), fmt(every)))
        print("Redis commands per trial (a first request and its "
              "duplicate):")
        for name in sorted(after):
            d = after[name] - before.get(name, 0)
            if d and name not in ("info",):
                print("  %-12s %6.2f" % (name, d / max(n, 1)))
        return 0
    finally:
        for proc in procs:
            storm.stop_process(proc, signal.SIGQUIT, 10)
        if redis:
            redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
