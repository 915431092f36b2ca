#!/usr/bin/env python3
"""Streams one Chat Completions request and prints its content as JSON (stdlib only).

  stream_client.py URL BODY_JSON [--kill-after N --engines [HOST:]PORT:PID,... [--signal TERM]]

With --kill-after, after N content chunks it asks every engine's /metrics which one
runs the generation and sends that process SIGKILL (or --signal TERM: a drain) -- a
drill: the router must fail over;
the output then also has the killed pid and the seconds from the kill to the next chunk.
"""
import json
import os
import signal
import sys
import time
import urllib.request


def running(host, port):
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dsinfer_requests_running "):
                return float(line.split()[1])
    return 0.0


def main():
    url, body = sys.argv[1], sys.argv[2]
    kill_after, engines = None, []
    if "--kill-after" in sys.argv:
        kill_after = int(sys.argv[sys.argv.index("--kill-after") + 1])
        spec = sys.argv[sys.argv.index("--engines") + 1]
        for e in spec.split(","):
            parts = e.split(":")
            host = parts[0] if len(parts) == 3 else "127.0.0.1"
            engines.append((host, int(parts[-2]), int(parts[-1])))
    sig = signal.SIGKILL
    if "--signal" in sys.argv:
        sig = getattr(signal, "SIG" + sys.argv[sys.argv.index("--signal") + 1])
    req = urllib.request.Request(url, data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    out = {"content": "", "chunks": 0, "killed_pid": None, "resume_s": None, "done": False,
           "gaps": []}
    killed_at = None
    last_chunk = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                break
            ev = json.loads(data)
            usage = ev.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                out["cached_tokens"] = details["cached_tokens"]
            if "error" in ev:
                out["error"] = ev["error"]
                continue
            if "completion_tokens" in usage:
                out["completion_tokens"] = usage["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("finish_reason"):
                out["finish_reason"] = ev["choices"][0]["finish_reason"]
            delta = ev["choices"][0]["delta"] if ev.get("choices") else {}
            if delta.get("content"):
                now = time.monotonic()
                if last_chunk is not None and killed_at is None:
                    out["gaps"].append(now - last_chunk)  # between chunks, before any kill
                last_chunk = now
                out["content"] += delta["content"]
                out["chunks"] += 1
                if killed_at is not None and out["resume_s"] is None:
                    out["resume_s"] = time.monotonic() - killed_at
            if kill_after is not None and out["chunks"] == kill_after and killed_at is None:
                for host, port, pid in engines:
                    if running(host, port) > 0:
                        os.kill(pid, sig)
                        out["killed_pid"] = pid
                        killed_at = time.monotonic()
                        break
    print(json.dumps(out))


if __name__ == "__main__":
    main()
