"""HTTP/2 client of t/150-roads.t (h2c with prior knowledge, python3-h2).

Reads one JSON request per line on stdin, makes it on a new connection and
writes one JSON line with the answer on stdout:

  {"port": P, "path": "/x?r=ok", "headers": [["name", "value"], ...],
   "body": "...", "mode": "stay" | "leave_hdr" | "leave_body",
   "leave_after": 0.15, "timeout": 20}
  -> {"status": 200, "headers": {"name": ["value"]}, "body_length": N,
      "complete": true, "have_header": true, "error": ""}
     followed by the N bytes of the body

A client that leaves closes its socket: before the response header
(leave_after seconds after the request went out) or once the header and
the first body bytes arrived (at most 0.3 s after the header).
"""

import json
import select
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

# windows large enough for a whole 2 MB answer: no WINDOW_UPDATE round trips
WINDOW = 16 * 1024 * 1024


def request(o):
    res = {"status": 0, "headers": {}, "body": "", "complete": False,
           "have_header": False, "error": ""}
    parts = []
    mode = o.get("mode", "stay")
    sock = socket.create_connection(("127.0.0.1", o["port"]), timeout=5)
    try:
        conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True,
                                             header_encoding="utf-8"))
        conn.initiate_connection()
        conn.update_settings(
            {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        conn.increment_flow_control_window(WINDOW - 65535)
        data = o.get("body", "").encode()
        sid = conn.get_next_available_stream_id()
        hdrs = [(":method", "POST"), (":path", o["path"]),
                (":scheme", "http"), (":authority", "localhost"),
                ("content-length", str(len(data)))]
        hdrs += [(n.lower(), v) for n, v in o.get("headers", [])]
        conn.send_headers(sid, hdrs)
        conn.send_data(sid, data, end_stream=True)
        sock.sendall(conn.data_to_send())

        start = time.monotonic()
        deadline = start + (o.get("leave_after", 0.15) if mode == "leave_hdr"
                            else o.get("timeout", 20))
        hdr_at = None
        done = False
        while not done:
            now = time.monotonic()
            if mode == "leave_body" and hdr_at is not None:
                if parts or now > hdr_at + 0.3:
                    break
            left = deadline - now
            if left <= 0:
                break
            wait = min(left, 0.05) if hdr_at is not None else left
            r, _, _ = select.select([sock], [], [], wait)
            if not r:
                continue
            chunk = sock.recv(65536)
            if not chunk:
                break
            for ev in conn.receive_data(chunk):
                if isinstance(ev, h2.events.ResponseReceived) \
                        and ev.stream_id == sid:
                    for n, v in ev.headers:
                        if n == ":status":
                            res["status"] = int(v)
                        else:
                            res["headers"].setdefault(n, []).append(v)
                    res["have_header"] = True
                    hdr_at = time.monotonic()
                elif isinstance(ev, h2.events.DataReceived):
                    if ev.stream_id == sid:
                        parts.append(ev.data)
                    conn.acknowledge_received_data(
                        ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded) \
                        and ev.stream_id == sid:
                    res["complete"] = res["have_header"]
                    done = True
                elif isinstance(ev, h2.events.StreamReset) \
                        and ev.stream_id == sid:
                    res["error"] = "RST_STREAM %s" % ev.error_code
                    done = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    res["error"] = "GOAWAY %s" % ev.error_code
                    done = True
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
    except (OSError, h2.exceptions.H2Error) as e:
        res["error"] = str(e)
    finally:
        sock.close()
    return res, b"".join(parts)


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        res, body = request(json.loads(line))
        res["body_length"] = len(body)
        out = sys.stdout.buffer
        out.write(json.dumps(res).encode() + b"\n" + body)
        out.flush()


if __name__ == "__main__":
    main()
