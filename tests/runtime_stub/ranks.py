"""A torchrun stand-in for the multi-rank tests: `python3 ranks.py N CMD ARGS...` starts N children at
once, child r with RANK=r, LOCAL_RANK=r, WORLD_SIZE=N and every "{rank}" / "{k}" in ARGS replaced by r /
r + 1; prints "agent PID" and "rank R pid PID" per child, waits for all and exits with the first nonzero
status. Like torchrun's elastic agent it never touches CUDA itself."""

import os
import subprocess
import sys


def main() -> int:
    n, cmd = int(sys.argv[1]), sys.argv[2:]
    print(f"agent {os.getpid()}", flush=True)
    children = []
    for r in range(n):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n)}
        child = subprocess.Popen([a.replace("{rank}", str(r)).replace("{k}", str(r + 1)) for a in cmd], env=env)
        print(f"rank {r} pid {child.pid}", flush=True)
        children.append(child)
    statuses = [c.wait() for c in children]
    return next((s for s in statuses if s), 0)


if __name__ == "__main__":
    sys.exit(main())
