"""A Python job whose parent starts worker processes, as a PyTorch DataLoader or a multiprocessing pool
does: `python3 app_workers.py METHOD N K` starts N workers with the multiprocessing start method METHOD
(spawn, fork, forkserver); worker i loads app_vec.py's module and launches its kernel K + i times on the
stand-in driver, through ctypes. The parent never touches CUDA. Prints "worker I pid PID" per worker
(from the worker) and exits with the first nonzero exit code of a worker."""

import multiprocessing
import os
import sys

import app_vec


def work(i: int, k: int) -> None:
    _, _, r = app_vec.launch("module", k + i, 32)
    os.write(1, f"worker {i} pid {os.getpid()} result={r}\n".encode())  # one write: workers share the pipe
    sys.exit(1 if r else 0)


def main() -> int:
    method, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = multiprocessing.get_context(method)
    workers = [ctx.Process(target=work, args=(i, k)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return next((w.exitcode for w in workers if w.exitcode), 0)


if __name__ == "__main__":
    sys.exit(main())
