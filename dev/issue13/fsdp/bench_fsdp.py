"""FSDP2 against DDP on the same processes: median time per training batch, and per-process bytes of parameters + optimizer state.
Run: torchrun --standalone --nproc_per_node 2 bench_fsdp.py [hidden] [layers] [batches]
On CPU, Accelerate would train FSDP as plain DDP: the FSDP2 path is forced with the test helper (the numbers say so)."""
import os, resource, sys, time, statistics
import torch
from torch import nn
from fastai.basics import *
from accelerate.utils import FullyShardedDataParallelPlugin
from fastxtend_accel.core import *
from fastxtend_accel.fsdp import local_bytes, _forced_cpu_fsdp

hidden,layers,batches = [int(a) for a in sys.argv[1:4]] if len(sys.argv) > 3 else (1024, 4, 30)
world,bs = int(os.environ.get('WORLD_SIZE', 1)),64
cuda = torch.cuda.is_available()

def learner():
    set_seed(0)
    n = bs*world*batches
    x,y = torch.randn(n, hidden),torch.randn(n, 1)
    dsets = Datasets(range(n), [[x.__getitem__], [y.__getitem__]], splits=[range(n), range(bs*world)])
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(hidden, hidden), nn.ReLU())], nn.Linear(hidden, 1))
    return Learner(dsets.dataloaders(bs=bs, device='cpu', num_workers=0), model, loss_func=MSELossFlat(), opt_func=Adam)

class Meter(Callback):
    "Wall time of each training batch (all processes in step), and the peak bytes this process holds"
    order = 100
    def before_fit(self): self.times,self.peak = [],{}
    def before_batch(self):
        if self.training: torch.distributed.barrier(); self.t0 = time.perf_counter()
    def after_step(self):
        if cuda: torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t0)
        b = local_bytes(self.learn.model, self.learn.opt)
        if b['total'] > self.peak.get('total', 0): self.peak = b

res = {}
for mode in ('ddp', 'fsdp'):
    learn = learner()
    if mode == 'ddp': learn.accelerate(mixed_precision='no')
    else:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        if cuda: learn.accelerate(fsdp_plugin=plugin, mixed_precision='no')
        else:
            with _forced_cpu_fsdp(): learn.accelerate(fsdp_plugin=plugin, mixed_precision='no')
    if cuda: torch.cuda.reset_peak_memory_stats()
    meter = Meter()
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-4, cbs=meter)
    res[mode] = dict(ms=1000*statistics.median(meter.times[3:]), **meter.peak,
                     gpu_peak=torch.cuda.max_memory_allocated() if cuda else None)

if learn.is_main_process:
    n_params = sum(p.numel() for p in learner().model.parameters())
    print(f"{world} processes on {'CUDA' if cuda else 'CPU (FSDP2 path forced)'}; MLP {layers}x{hidden} ({n_params/1e6:.1f}M params), Adam, bs {bs}/process, {batches} batches")
    print(f"{'':6}{'ms/batch':>10}{'params MB':>11}{'opt MB':>9}{'total MB':>10}" + (f"{'GPU peak MB':>13}" if cuda else ''))
    for k,r in res.items():
        print(f"{k:6}{r['ms']:10.1f}{r['params']/2**20:11.2f}{r['opt']/2**20:9.2f}{r['total']/2**20:10.2f}" + (f"{r['gpu_peak']/2**20:13.1f}" if cuda else ''))
    print(f"FSDP2/DDP: time x{res['fsdp']['ms']/res['ddp']['ms']:.2f}, parameter+optimizer bytes per process x{res['fsdp']['total']/res['ddp']['total']:.2f}")
