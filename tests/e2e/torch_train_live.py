"""A small model trained by stock PyTorch for live attach (tests/test_sass_live_gpu.py).

`torch_train_live.py eager|compile STEPS` trains STEPS steps; `... eager|compile STOP` trains until the
file STOP exists (creating STOP.ready once three steps ran: compiled and warm), sleeping PACE_S after
each step so that the launches stay under the 2^18 launch ids tests/e2e/launch_threads_by_id.bpf.c keeps.
It prints `STEPS n LOSSES <sha256> WEIGHTS <sha256>`: a run of the same number of steps must print the
same line (deterministic algorithms, fixed seed and data).
"""

import faulthandler
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS
import torch  # noqa: E402

PACE_S = 0.01
if os.environ.get("EGPU_TEST_STACKS_AFTER"):   # a job that hangs says where (every thread's stack)
    faulthandler.dump_traceback_later(float(os.environ["EGPU_TEST_STACKS_AFTER"]), exit=True)
mode, until = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                            torch.nn.Linear(512, 256)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
forward = model if mode == "eager" else torch.compile(model)

steps = int(until) if until.isdigit() else None
losses = []
while steps is None or len(losses) < steps:
    if steps is None and os.path.exists(until):
        break
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(forward(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    if steps is None:
        if len(losses) == 3:
            torch.cuda.synchronize()
            open(until + ".ready", "w").close()
        time.sleep(PACE_S)
torch.cuda.synchronize()
loss_bytes = torch.stack(losses).cpu().numpy().tobytes()
weights = b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
print(f"STEPS {len(losses)} LOSSES {hashlib.sha256(loss_bytes).hexdigest()} "
      f"WEIGHTS {hashlib.sha256(weights).hexdigest()}")
