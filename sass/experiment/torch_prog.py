"""Stock PyTorch eager (SASS-only kernels: cuBLAS, cuDNN, ATen), one operation between two tool marks.

Prints HASH lines (outputs, compared with a run without the tool) and EXPECT lines for the operations with a
known access pattern. With SASS_TOOL_MODE=api it loads the tool itself (ctypes, i.e. dlopen) and calls
sass_tool_start() before CUDA is initialised: the arrangement egpu's shim would use."""
import ctypes
import hashlib
import os

# Deterministic kernels, so that outputs can be compared with a run without the tool: cuBLAS needs a fixed
# workspace (set before it initialises), and autograd's atomics-based kernels are swapped for ordered ones.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

lib = None
if os.environ.get("SASS_TOOL_LIB"):
    lib = ctypes.CDLL(os.environ["SASS_TOOL_LIB"])  # same object as an injected/preloaded copy
    if os.environ.get("SASS_TOOL_MODE") == "api":
        print(f"TOOLSTART rc={lib.sass_tool_start()}", flush=True)

import torch  # noqa: E402  (after the tool on purpose)
import torch.nn.functional as F  # noqa: E402


def mark(what: str) -> None:
    torch.cuda.synchronize()
    if lib is not None:
        lib.sass_tool_mark(what.encode())


def digest(name: str, t: torch.Tensor) -> None:
    print(f"HASH {name}={hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]}")


torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
dev = "cuda"
n = (1 << 20) + 3
g = torch.Generator(device="cpu").manual_seed(0)
x = torch.randn(n, generator=g).to(dev)
y = torch.randn(n, generator=g).to(dev)
A = torch.randn(256, 256, generator=g).to(dev)
B = torch.randn(256, 256, generator=g).to(dev)
img = torch.randn(8, 16, 32, 32, generator=g).to(dev)
w = torch.randn(32, 16, 3, 3, generator=g).to(dev)
z = torch.empty((n + 1) // 2, device=dev)
torch.manual_seed(0)  # the MLP's initial weights: the same in every run, or its outputs cannot be compared
mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
inp = torch.randn(32, 64, generator=g).to(dev)
tgt = torch.randint(0, 10, (32,), generator=g).to(dev)
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)

mark("add")
s = x + y
mark("copy")
z.copy_(x[::2])  # strided: an ATen copy kernel (a contiguous copy_ is a cudaMemcpy, no kernel)
mark("sum")
r = x.sum()
mark("matmul")
C = A @ B
mark("conv")
o = F.conv2d(img, w, padding=1)
mark("mlp")
loss = F.cross_entropy(mlp(inp), tgt)
opt.zero_grad()
loss.backward()
opt.step()
mark("end")

print(f"EXPECT op=add launches=1 ldbytes={8 * n} stbytes={4 * n}")
print(f"EXPECT op=copy launches=1 ldbytes={4 * z.numel()} stbytes={4 * z.numel()}")
for name, t in [("add", s), ("copy", z), ("sum", r), ("matmul", C), ("conv", o), ("loss", loss),
                ("mlp_w0", mlp[0].weight)]:
    digest(name, t)
