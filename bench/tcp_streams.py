# Loopback TCP throughput with K parallel connections per direction (the
# measurement behind the tcp backend's lanes): python3 bench/tcp_streams.py
import os
import socket
import threading
import time

def pair():
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(16)
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept(); l.close()
    for x in (c, s): x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c, s

def run(K, msg, iters, bidir):
    dirs = 2 if bidir else 1
    conns = [[pair() for _ in range(K)] for _ in range(dirs)]
    piece = msg // K
    src = bytearray(os.urandom(1024)) * (piece // 1024 + 1)
    src = memoryview(src)[:piece]
    bar = threading.Barrier(2 * K * dirs + 1)
    def snd(sock):
        bar.wait()
        for _ in range(iters): sock.sendall(src)
    def rcv(sock):
        buf = memoryview(bytearray(piece))
        bar.wait()
        for _ in range(iters):
            got = 0
            while got < piece:
                got += sock.recv_into(buf[got:], piece - got)
    ts = []
    for d in range(dirs):
        for (c, s) in conns[d]:
            ts.append(threading.Thread(target=snd, args=(c,)))
            ts.append(threading.Thread(target=rcv, args=(s,)))
    for t in ts: t.start()
    bar.wait(); t0 = time.perf_counter()
    for t in ts: t.join()
    dt = time.perf_counter() - t0
    for d in conns:
        for (c, s) in d: c.close(); s.close()
    return msg * iters / dt / 1e9

for bidir in (False, True):
    for msg in (1 << 20, 16 << 20):
        row = []
        for K in (1, 2, 4, 8):
            best = max(run(K, msg, max(4, (512 << 20) // msg), bidir) for _ in range(3))
            row.append(f"K={K}: {best:5.2f}")
        print(("bidir " if bidir else "one-way ") + f"{msg>>20} MiB GB/s per direction: " + "  ".join(row), flush=True)
