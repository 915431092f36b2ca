#!/usr/bin/env python3
"""A TCP proxy for the cluster drills (stdlib only): what `tc netem` would do where the
kernel has no sch_netem, plus damage a KV transfer.

  fault_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT [--delay-ms D] [--corrupt-at N]

--delay-ms D: every piece of data is held D ms before it is forwarded (both ways).
--corrupt-at N: in the first connection only, byte N of the client -> target stream is
flipped (a KV transfer's frame digest then fails on arrival). Prints one line per
connection and "corrupted" when it flipped a byte.
"""
import asyncio
import sys


async def pump(reader, writer, delay, corrupt_at, state):
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
    if "--corrupt-at" in sys.argv:
        corrupt_at = int(sys.argv[sys.argv.index("--corrupt-at") + 1])
    lh, lp = listen.rsplit(":", 1)
    th, tp = target.rsplit(":", 1)
    state = {"done": False, "connections": 0}

    async def handle(cr, cw):
        state["connections"] += 1
        first = state["connections"] == 1
        print(f"connection {state['connections']}", flush=True)
        try:
            tr, tw = await asyncio.open_connection(th, int(tp))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pump(cr, tw, delay, corrupt_at if first else None, state),
                             pump(tr, cw, delay, None, state))

    server = await asyncio.start_server(handle, lh, int(lp))
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
