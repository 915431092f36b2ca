#!/usr/bin/env python3
"""A TCP proxy for the cluster drills (stdlib only): what `tc netem` would do where the
kernel has no sch_netem, plus damage a KV transfer.

  fault_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT [--delay-ms D] [--loss-pct P] [--corrupt-at N]

--delay-ms D: every piece of data is held D ms before it is forwarded (both ways).
--loss-pct P: P % of 1448-byte segments are lost (both ways), as TCP shows a loss to the
  application: the in-order stream stalls for the retransmission (200 ms, Linux's minimum
  RTO) at that point, and nothing behind the lost segment arrives first. The kernel here
  has no sch_netem, which would drop real packets. Seeded (1), so a run is reproducible;
  prints "lost N" for each stall (N segments).
--corrupt-at N: in the first connection only, byte N of the client -> target stream is
flipped (a KV transfer's frame digest then fails on arrival). Prints one line per
connection and "corrupted" when it flipped a byte.
"""
import asyncio
import random
import sys

SEGMENT = 1448       # bytes of payload in one TCP segment on a 1500-byte MTU
RETRANSMIT_S = 0.2   # Linux's minimum retransmission timeout


async def pump(reader, writer, delay, corrupt_at, state, loss=0.0):
    sent = 0
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if corrupt_at is not None and not state["done"] and sent <= corrupt_at < sent + len(data):
                i = corrupt_at - sent
                data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]
                state["done"] = True
                print("corrupted", flush=True)
            sent += len(data)
            if delay:
                await asyncio.sleep(delay)
            if loss > 0:
                segments = (len(data) + SEGMENT - 1) // SEGMENT
                n = sum(1 for _ in range(segments) if state["rng"].random() < loss)
                if n:
                    print(f"lost {n}", flush=True)
                    await asyncio.sleep(n * RETRANSMIT_S)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    listen, target = sys.argv[1], sys.argv[2]
    delay = 0.0
    corrupt_at = None
    if "--delay-ms" in sys.argv:
        delay = float(sys.argv[sys.argv.index("--delay-ms") + 1]) / 1000.0
    loss = 0.0
    if "--loss-pct" in sys.argv:
        loss = float(sys.argv[sys.argv.index("--loss-pct") + 1]) / 100.0
    if "--corrupt-at" in sys.argv:
        corrupt_at = int(sys.argv[sys.argv.index("--corrupt-at") + 1])
    lh, lp = listen.rsplit(":", 1)
    th, tp = target.rsplit(":", 1)
    state = {"done": False, "connections": 0, "rng": random.Random(1)}

    async def handle(cr, cw):
        state["connections"] += 1
        first = state["connections"] == 1
        print(f"connection {state['connections']}", flush=True)
        try:
            tr, tw = await asyncio.open_connection(th, int(tp))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pump(cr, tw, delay, corrupt_at if first else None, state, loss),
                             pump(tr, cw, delay, None, state, loss))

    server = await asyncio.start_server(handle, lh, int(lp))
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
