#!/usr/bin/env python3
"""Side-by-side proxy CPU per request (performance.md P1/P10): Portico vs nginx vs HAProxy.

Topology on a 2-core box: wrk (core 1) -> proxy under test (core 0, one worker) -> portico origin
(core 1, one worker), HTTP/1.1 keep-alive on both legs, all on 127.0.0.1. The proxy's CPU time
(utime + stime of its whole process tree, from /proc) is divided by the requests wrk completed.
A run with any non-2xx response or socket error is void. Until `portico bench` exists (issue 4) wrk
is the closed-loop load generator: these figures are CPU per request, never latency claims.

With --https the client leg is TLS 1.3 (ECDSA P-256 certificate made with openssl, X25519 key
exchange: wrk's OpenSSL offers it first, nginx pins it with ssl_ecdh_curve, HAProxy with curves);
the upstream leg stays plain HTTP/1.1 keep-alive (performance.md P4).

With --latency RATE the load is `portico bench --rate RATE` (open loop, coordinated-omission
corrected) instead of wrk, "direct" (no proxy) joins the list, and the report adds p50/p99/p99.99/max
latency per proxy (performance.md P12: latency added by the proxy at a fixed load). HTTP only.

Usage: scripts/bench-compare.py [--duration 10] [--size 1k] [--connections 50] [--rounds 3] [--https]
                                [--latency RATE]
Installs nothing; needs nginx, haproxy, wrk (apt-get install -y nginx haproxy wrk).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def tree(pid):
    pids = [pid]
    for p in list(pids):
        try:
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(p)], capture_output=True, text=True).stdout
        except OSError:
            out = ""
        pids += [int(x) for x in out.split()]
    return pids


def cpu_seconds(pids):
    """(user, system) CPU seconds of these processes: utime and stime, fields 14 and 15."""
    user = system = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except OSError:
            pass
    return user / TICKS, system / TICKS


def run_wrk(url, duration, connections):
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{duration}s", url]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    m = re.search(r"(\d+) requests in", out)
    reqs = int(m.group(1)) if m else 0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return {
        "requests": reqs,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1).strip() if errors else "",
        "rps": float(rps.group(1)) if rps else 0.0,
        "raw": out,
    }


def make_cert(d):
    """A self-signed ECDSA P-256 certificate for localhost: (cert, key, cert+key for HAProxy)."""
    cert, key, both = f"{d}/cert.pem", f"{d}/key.pem", f"{d}/both.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-days", "2"],
        check=True, capture_output=True)
    open(both, "w").write(open(cert).read() + open(key).read())
    return cert, key, both


def run_portico_bench(portico, url, duration, connections, rate, d):
    out_json = f"{d}/bench.json"
    cmd = ["taskset", "-c", "1", portico, "bench", "--rate", str(rate), "-c", str(connections),
           "-d", f"{duration}s", "--warmup", "2s", "--json", out_json, url]
    subprocess.run(cmd, capture_output=True, text=True)
    r = json.load(open(out_json))
    return r


def nginx_conf(d, port, origin, https=False):
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(f"{d}/{sub}", exist_ok=True)
    tls = (f"ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem; ssl_protocols TLSv1.3; "
           "ssl_ecdh_curve X25519; ssl_session_tickets off;") if https else ""
    return f"""
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 10000; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream b {{ server {origin}; keepalive 100; }}
    server {{
        listen 127.0.0.1:{port}{" ssl" if https else ""};
        {tls}
        location / {{
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://b;
        }}
    }}
}}
"""


def haproxy_conf(d, port, origin, https=False):
    bind = f"bind 127.0.0.1:{port} ssl crt {d}/both.pem ssl-min-ver TLSv1.3 curves X25519" if https else f"bind 127.0.0.1:{port}"
    return f"""
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend f
    {bind}
    default_backend b
backend b
    server s1 {origin}
"""


def portico_conf(d, port, origin, https=False):
    tls = f"""[listeners.tls]
certificates = [{{ cert = "{d}/cert.pem", key = "{d}/key.pem" }}]
versions = "1.3"
groups = ["X25519"]
""" if https else ""
    return f"""
[[listeners]]
name = "p"
address = "127.0.0.1:{port}"
{tls}[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{origin}"]
keepalive = 100
"""


def start_proxy(name, d, port, origin, portico, https=False):
    if name == "portico":
        path = f"{d}/portico.toml"
        open(path, "w").write(portico_conf(d, port, origin, https))
        cmd = [portico, "run", "--config", path, "--workers", "1"]
    elif name == "nginx":
        path = f"{d}/nginx.conf"
        open(path, "w").write(nginx_conf(d, port, origin, https))
        cmd = ["nginx", "-c", path, "-p", d]
    elif name == "haproxy":
        path = f"{d}/haproxy.cfg"
        open(path, "w").write(haproxy_conf(d, port, origin, https))
        cmd = ["haproxy", "-f", path, "-db"]
    else:
        raise ValueError(name)
    log = open(f"{d}/{name}.log", "w")
    proc = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, RUST_LOG="info"))
    wait_port(port, proc)
    return proc


def version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--size", default="1k")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median per proxy is reported")
    ap.add_argument("--proxies", default="portico,nginx,haproxy")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--https", action="store_true", help="TLS 1.3 on the client leg")
    ap.add_argument("--latency", type=int, metavar="RATE", help="open-loop latency at RATE req/s with portico bench, plus 'direct'")
    args = ap.parse_args()

    portico = os.path.join(ROOT, "target/release/portico")
    subprocess.run(["cargo", "build", "--release", "--locked", "-p", "portico"], cwd=ROOT, check=True)
    proxies = [p for p in args.proxies.split(",") if p == "portico" or shutil.which(p)]
    d = tempfile.mkdtemp(prefix="portico-bench-")
    if args.https:
        make_cert(d)
    oport = free_port()
    origin = f"127.0.0.1:{oport}"
    olog = open(f"{d}/origin.log", "w")
    oproc = subprocess.Popen(["taskset", "-c", "1", portico, "origin", "--listen", origin, "--workers", "1"], stdout=olog, stderr=subprocess.STDOUT)
    if args.latency:
        if args.https:
            sys.exit("--latency is HTTP only for now (portico bench speaks http://)")
        proxies = ["direct"] + proxies
    results = {p: [] for p in proxies}
    try:
        wait_port(oport, oproc)
        for rnd in range(args.rounds):
            for name in proxies:
                port = free_port()
                proc = None if name == "direct" else start_proxy(name, d, port, origin, portico, args.https)
                scheme = "https" if args.https else "http"
                target = origin if name == "direct" else f"localhost:{port}"
                url = f"{scheme}://{target}/bytes/{args.size}"
                lat = None
                try:
                    pids = tree(proc.pid) if proc else []
                    if args.latency:
                        u0, s0 = cpu_seconds(pids)
                        b = run_portico_bench(portico, url, args.duration, args.connections, args.latency, d)
                        u1, s1 = cpu_seconds(pids)
                        req = b["requests"]
                        w = {"requests": req["completed"], "rps": b["achieved_rate"],
                             "non2xx": req["completed"] - b["status_classes"].get("2xx", 0),
                             "socket_errors": "" if req["errors"] == 0 and req["unsent"] == 0 else str(req)}
                        lat = {k: b["latency"]["percentiles"][k] for k in ("p50", "p99", "p99.99")}
                        lat["max"] = b["latency"]["max_ms"]
                        lat["warnings"] = b["warnings"]
                    else:
                        run_wrk(url, 2, args.connections)  # warm-up, excluded
                        u0, s0 = cpu_seconds(pids)
                        w = run_wrk(url, args.duration, args.connections)
                        u1, s1 = cpu_seconds(pids)
                    c0, c1 = u0 + s0, u1 + s1
                finally:
                    if proc:
                        proc.send_signal(signal.SIGTERM)
                        try:
                            proc.wait(timeout=15)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                void = w["requests"] == 0 or w["non2xx"] > 0 or w["socket_errors"] != ""
                r = {
                    "round": rnd,
                    "requests": w["requests"],
                    "rps": w["rps"],
                    "cpu_s": round(c1 - c0, 3),
                    "us_per_req": round((c1 - c0) * 1e6 / w["requests"], 3) if w["requests"] else None,
                    "user_us_per_req": round((u1 - u0) * 1e6 / w["requests"], 3) if w["requests"] else None,
                    "sys_us_per_req": round((s1 - s0) * 1e6 / w["requests"], 3) if w["requests"] else None,
                    "void": void,
                    "non2xx": w["non2xx"],
                    "socket_errors": w["socket_errors"],
                }
                if lat:
                    r["latency_ms"] = lat
                if name == "portico":
                    text = open(f"{d}/portico.log").read()
                    m = re.findall(r"upstream_requests=(\d+) upstream_reused=(\d+)", text)
                    if m:
                        up, reused = map(int, m[-1])
                        r["upstream_reuse_pct"] = round(reused * 100.0 / up, 4) if up else None
                results[name].append(r)
                print(f"round {rnd} {name:8} {r}", flush=True)
    finally:
        oproc.send_signal(signal.SIGTERM)
        oproc.wait(timeout=15)

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None

    summary = {}
    for name, rs in results.items():
        ok = [r for r in rs if not r["void"] and (r["us_per_req"] or name == "direct")]
        summary[name] = {
            "us_per_req_median": median([r["us_per_req"] for r in ok]),
            "user_us_per_req_median": median([r["user_us_per_req"] for r in ok]),
            "sys_us_per_req_median": median([r["sys_us_per_req"] for r in ok]),
            "rps_median": median([r["rps"] for r in ok]),
            "valid_rounds": len(ok),
            "latency_ms_median": {k: median([r["latency_ms"][k] for r in ok]) for k in ("p50", "p99", "p99.99", "max")} if args.latency else None,
        }
    print()
    print(f"{'proxy':10} {'us/req':>8} {'user':>8} {'system':>8} {'req/s':>9} {'valid rounds':>13}   (medians)")
    for name, s in summary.items():
        if name == "direct":
            continue
        print(f"{name:10} {s['us_per_req_median'] or 0:8.2f} {s['user_us_per_req_median'] or 0:8.2f} {s['sys_us_per_req_median'] or 0:8.2f} {s['rps_median'] or 0:9.0f} {s['valid_rounds']:13}")
    base = summary.get("portico", {}).get("us_per_req_median")
    for peer in ("nginx", "haproxy"):
        p = summary.get(peer, {}).get("us_per_req_median")
        if base and p:
            print(f"portico / {peer} CPU per request: {base / p:.3f}x")
    if args.latency:
        print()
        print(f"open-loop latency at {args.latency} req/s, ms (medians over rounds):")
        print(f"{'proxy':10} {'p50':>8} {'p99':>8} {'p99.99':>8} {'max':>8}   added p99 vs direct")
        direct = (summary.get("direct", {}).get("latency_ms_median") or {}).get("p99")
        for name, s in summary.items():
            lm = s.get("latency_ms_median") or {}
            if not lm or lm.get("p99") is None:
                continue
            added = f"{(lm['p99'] - direct) * 1000:8.0f} us" if direct is not None else ""
            print(f"{name:10} {lm['p50']:8.3f} {lm['p99']:8.3f} {lm['p99.99']:8.3f} {lm['max']:8.3f}   {added}")
    manifest = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "kernel": os.uname().release,
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        "versions": {"nginx": version(["nginx", "-v"]), "haproxy": version(["haproxy", "-v"]), "wrk": version(["wrk", "-v"]), "portico": version([portico, "--version"])},
        "args": vars(args),
    }
    if args.json:
        json.dump({"manifest": manifest, "results": results, "summary": summary}, open(args.json, "w"), indent=1, default=str)
    print(json.dumps(manifest))


if __name__ == "__main__":
    sys.exit(main())
