"""Accelerated fastai `Learner` vs a hand-written Accelerate loop on one GPU: a ResNet-ish conv net in bf16, eager and compiled.

    python bench/bench_gpu.py                      # on a CUDA GPU; most of its time goes into compiling
    python bench/bench_gpu.py --device cpu --tiny  # smoke run in seconds; its timings mean nothing

Every variant trains the same model (a ResNet-18-like net) on the same random images, with AdamW, bf16 through
Accelerate and the same batches, read from the same loader. The batches already live on the device, so the timings
compare the training loops, not host-to-device copies. Variants run interleaved in every repeat; each timing is one
epoch of `--steps` steps, and the table gives medians. The compiled variants use `model.compile()` (hand-written) and
`learn.compile(dynamic=False)` (both with static shapes). On CUDA, a last pass per variant, outside the timings, samples
the GPU's utilisation through NVML: the share of time the GPU was busy, and so how much of a step is spent waiting on the host.
"""
import argparse, statistics, threading, time, warnings
from functools import partial

import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, Dataset
from fastai.basics import Learner, DataLoaders, OptimWrapper, Callback, CancelValidException
from accelerate import Accelerator
from fastxtend_accel.core import *
from fastxtend_accel.compiler import *

class BasicBlock(nn.Module):
    def __init__(self, ni, nf, stride):
        super().__init__()
        self.conv1,self.bn1 = nn.Conv2d(ni, nf, 3, stride, 1, bias=False),nn.BatchNorm2d(nf)
        self.conv2,self.bn2 = nn.Conv2d(nf, nf, 3, 1, 1, bias=False),nn.BatchNorm2d(nf)
        self.short = (nn.Identity() if stride == 1 and ni == nf else
                      nn.Sequential(nn.Conv2d(ni, nf, 1, stride, bias=False), nn.BatchNorm2d(nf)))
    def forward(self, x): return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.short(x))

class ResNetish(nn.Module):
    "ResNet-18's layout (four stages of `depth` basic blocks, 2 in ResNet-18) with a stride-1 stem for small images"
    def __init__(self, width=64, depth=2, n_out=10):
        super().__init__()
        ws = [width, width*2, width*4, width*8]
        self.stem = nn.Sequential(nn.Conv2d(3, ws[0], 3, 1, 1, bias=False), nn.BatchNorm2d(ws[0]), nn.ReLU())
        blocks,ni = [],ws[0]
        for i,nf in enumerate(ws):
            blocks += [BasicBlock(ni, nf, 1 if i == 0 else 2)] + [BasicBlock(nf, nf, 1) for _ in range(depth-1)]
            ni = nf
        self.blocks,self.head = nn.Sequential(*blocks),nn.Linear(ni, n_out)
    def forward(self, x): return self.head(self.blocks(self.stem(x)).mean((2, 3)))

class Batches(Dataset):
    "`n` whole batches, cycling through `k` distinct random ones made on `device` (a loader with `batch_size=None` yields them as they are)"
    def __init__(self, n, bs, size, device, k=8):
        g = torch.Generator().manual_seed(0)
        self.n,self.xs = n,[torch.randn(bs, 3, size, size, generator=g).to(device) for _ in range(k)]
        self.ys = [torch.randint(0, 10, (bs,), generator=g).to(device) for _ in range(k)]
    def __len__(self): return self.n
    def __getitem__(self, i): return self.xs[i%len(self.xs)],self.ys[i%len(self.ys)]

def model(width, depth, device):
    torch.manual_seed(0)
    return ResNetish(width, depth).to(device)

def adamw(m): return torch.optim.AdamW(m.parameters(), lr=1e-4)

def _sync(device):
    if device == 'cuda': torch.cuda.synchronize()

def torch_loop(m, dl, device):
    "Plain PyTorch, autocast to bf16 by hand: the floor under the Accelerate loop (eager only)"
    opt = adamw(m)
    def run():
        m.train()
        for xb,yb in dl:
            with torch.autocast(device, dtype=torch.bfloat16): loss = F.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step(); opt.zero_grad()
    return run

def accelerate_loop(m, dl, compiled, backend, device):
    "The loop Accelerate's docs show: `prepare`, then `accelerator.backward`"
    acc = Accelerator(mixed_precision='bf16', cpu=device == 'cpu')
    opt = adamw(m)
    if compiled: m.compile(backend=backend) # compile the bare model before `prepare`, as PyTorch advises
    m,opt = acc.prepare(m, opt)
    def run():
        m.train()
        for xb,yb in dl:
            acc.backward(F.cross_entropy(m(xb), yb))
            opt.step(); opt.zero_grad()
    return run

class TrainTimer(Callback):
    "Time the training phase of a fit, leaving out set-up and validation"
    order = 100
    def __init__(self, device): self.dev = device
    def before_train(self): self.start = time.perf_counter()
    def after_train(self):
        _sync(self.dev)
        self.elapsed = time.perf_counter() - self.start
    def before_validate(self): raise CancelValidException()

def learner_loop(m, dl, compiled, backend, device):
    "A fastai `Learner` with `.accelerate(mixed_precision='bf16')` (and `.compile()`)"
    learn = Learner(DataLoaders(dl, dl), m, loss_func=F.cross_entropy, opt_func=partial(OptimWrapper, opt=torch.optim.AdamW),
                    lr=1e-4, cbs=TrainTimer(device)).accelerate(mixed_precision='bf16', cpu=device == 'cpu')
    if compiled: learn.compile(backend=backend, dynamic=False)
    def run():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        return learn.train_timer.elapsed
    return run

class Utilisation:
    "Sample the GPU's utilisation (%, from NVML) in a thread, while the `with` block runs"
    def __enter__(self):
        self.samples,self.done = [],threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self
    def _sample(self):
        while not self.done.wait(0.01): self.samples.append(torch.cuda.utilization())
    def __exit__(self, *exc):
        self.done.set(); self.thread.join()
    @property
    def mean(self): return statistics.mean(self.samples) if self.samples else float('nan')

def nvml_ok():
    try: torch.cuda.utilization(); return True
    except Exception: return False

def timed(run, device):
    start = time.perf_counter()
    res = run()
    _sync(device)
    return res if res is not None else time.perf_counter() - start

PAIRS = [('Accelerate loop', 'fastxtend_accel Learner'), ('Accelerate loop + compile', 'fastxtend_accel Learner + compile')]

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--width', type=int, default=64, help='channels of the first stage (ResNet-18: 64)')
    p.add_argument('--depth', type=int, default=2, help='basic blocks per stage (ResNet-18: 2)')
    p.add_argument('--size', type=int, default=32, help='image side, pixels (CIFAR-sized by default)')
    p.add_argument('--bs', type=int, default=512)
    p.add_argument('--steps', type=int, default=40, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--backend', default=None, help="compile backend (default: inductor; 'eager' in --tiny mode on CPU)")
    p.add_argument('--no-compile', action='store_true', help='time the eager variants only')
    p.add_argument('--tiny', action='store_true', help='a smoke run of a few seconds: tiny model, images and batches')
    args = p.parse_args()
    if args.tiny: args.width,args.depth,args.size,args.bs,args.steps,args.repeats = 4,1,8,4,2,1
    backend = args.backend or ('eager' if args.tiny and args.device == 'cpu' else 'inductor')
    warnings.filterwarnings('ignore')
    torch.set_float32_matmul_precision('high') # what `learn.compile()` sets during its fits; the same for every variant
    if args.device == 'cuda': torch.backends.cudnn.benchmark = True
    else: torch.set_num_threads(min(2, torch.get_num_threads()))
    dl = TorchDL(Batches(args.steps, args.bs, args.size, args.device), batch_size=None)
    new = partial(model, args.width, args.depth, args.device)
    variants = {'torch loop': torch_loop(new(), dl, args.device)}
    for compiled in ([False] if args.no_compile else [False, True]):
        for name,make in [('Accelerate loop', accelerate_loop), ('fastxtend_accel Learner', learner_loop)]:
            variants[name + (' + compile' if compiled else '')] = make(new(), dl, compiled, backend, args.device)
    start = time.perf_counter()
    for run in variants.values(): timed(run, args.device) # warm up: cuDNN's choices, and compiling
    warm = time.perf_counter() - start
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k,run in variants.items(): times[k].append(timed(run, args.device)/args.steps)
    util = {}
    if args.device == 'cuda' and nvml_ok():
        for k,run in variants.items():
            with Utilisation() as u: timed(run, args.device)
            util[k] = u.mean
    med = {k: statistics.median(ts) for k,ts in times.items()}
    ref = {b: a for a,b in PAIRS} | {a: a for a,_ in PAIRS} | {'torch loop': 'Accelerate loop'}
    dev = torch.cuda.get_device_name() if args.device == 'cuda' else f'cpu, {torch.get_num_threads()} threads'
    print(f"\nResNet-ish (width {args.width}, {args.depth} blocks per stage) on {args.size}x{args.size} random images, bs {args.bs}, bf16, AdamW, "
          f"{args.steps} steps x {args.repeats} interleaved repeats, compile backend {backend!r}; {dev}, torch {torch.__version__}; "
          f"warm-up and compiling {warm:.0f}s")
    print(f"| {'variant':<34} | ms/step (median) | min-max ms | images/s | vs its Accelerate loop | GPU busy | GPU busy ms/step |")
    print(f"|{'-'*36}|------------------|------------|----------|------------------------|----------|------------------|")
    for k,m in med.items():
        ratio = f'{m/med[ref[k]]:.3f}x' if ref[k] in med else ''
        busy = f'{util[k]:.0f}%' if k in util else '-'
        busy_ms = f'{m*util[k]/100*1e3:.2f}' if k in util else '-'
        print(f"| {k:<34} | {m*1e3:16.2f} | {min(times[k])*1e3:.2f}-{max(times[k])*1e3:.2f} | {args.bs/m:8.0f} | {ratio:>22} | {busy:>8} | {busy_ms:>16} |")
    print()
    for loop,learner in PAIRS:
        if learner not in med: continue
        r = med[learner]/med[loop]
        print(f"target: {learner} <= 1.03x the {loop}: {r:.3f}x -> {'met' if r <= 1.03 else 'NOT met'}"
              + (' (smoke run: timings not meaningful)' if args.tiny else ''))
    if util: print("GPU busy: NVML's share of time a kernel ran, sampled in a separate untimed pass; "
                   "ms/step minus GPU busy ms/step is the time the GPU waited on the host.")

if __name__ == '__main__': main()
