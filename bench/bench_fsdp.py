"""FSDP2 against DDP on the same processes: median time per training batch, and the bytes of parameters + optimizer state
each process holds at its peak. DDP and FSDP2 fits alternate, `repeats` times each, and the medians are taken over all of them.

Run: torchrun --standalone --nproc_per_node 2 bench/bench_fsdp.py [--hidden 1024] [--layers 4] [--batches 30] [--repeats 3]
On CPU, Accelerate would train an FSDP request as plain DDP: the FSDP2 path is forced there with the library's test-only
helper (the output says so); on GPUs Accelerate sets FSDP2 up itself."""
import argparse, os, statistics, time
import torch
from torch import nn
from fastai.basics import *
from accelerate.utils import FullyShardedDataParallelPlugin
from fastxtend_accel.core import *
from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
from fastxtend_accel.fsdp_values import local_bytes

p = argparse.ArgumentParser()
p.add_argument('--hidden', type=int, default=1024)
p.add_argument('--layers', type=int, default=4)
p.add_argument('--batches', type=int, default=30, help='training batches per fit (per process)')
p.add_argument('--bs', type=int, default=64, help='batch size per process')
p.add_argument('--repeats', type=int, default=3, help='fits per mode, alternating DDP and FSDP2')
args = p.parse_args()
world,cuda = int(os.environ.get('WORLD_SIZE', 1)),torch.cuda.is_available()
skip = 3 # warm-up batches of each fit, left out of the timings

def learner():
    set_seed(0)
    n = args.bs*world*args.batches
    x,y = torch.randn(n, args.hidden),torch.randn(n, 1)
    dsets = Datasets(range(n), [[x.__getitem__], [y.__getitem__]], splits=[range(n), range(args.bs*world)])
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.hidden, args.hidden), nn.ReLU())], nn.Linear(args.hidden, 1))
    return Learner(dsets.dataloaders(bs=args.bs, device='cpu', num_workers=0), model, loss_func=MSELossFlat(), opt_func=Adam)

class Meter(Callback):
    "Wall time of each training batch (all processes starting it together), and the peak bytes this process holds"
    order = 100
    def before_fit(self): self.times,self.peak = [],{}
    def before_batch(self):
        if not self.training: return
        torch.distributed.barrier()
        self.t0 = time.perf_counter()
    def after_step(self):
        if cuda: torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t0)
        b = local_bytes(self.learn.model, self.learn.opt)
        if b['total'] > self.peak.get('total', 0): self.peak = b

def accelerated(mode):
    learn = learner()
    if mode == 'ddp': return learn.accelerate(mixed_precision='no')
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    if cuda: return learn.accelerate(fsdp_plugin=plugin, mixed_precision='no')
    return learn.accelerate(cpu_fsdp_accelerator(fsdp_plugin=plugin, mixed_precision='no'))

times,peaks,gpu = {'ddp': [], 'fsdp': []},{},{}
for _ in range(args.repeats):
    for mode in ('ddp', 'fsdp'):
        learn,meter = accelerated(mode),Meter()
        if cuda: torch.cuda.reset_peak_memory_stats()
        with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-4, cbs=meter)
        times[mode] += meter.times[skip:]
        peaks[mode] = meter.peak
        if cuda: gpu[mode] = torch.cuda.max_memory_allocated()

if learn.is_main_process:
    n_params = sum(p.numel() for p in learner().model.parameters())
    print(f"{world} processes on {'CUDA' if cuda else 'CPU (FSDP2 path forced with the test helper)'}; MLP {args.layers}x{args.hidden} "
          f"({n_params/1e6:.1f}M params), Adam, bs {args.bs}/process; {args.repeats} alternating fits of {args.batches} batches per mode")
    print(f"{'':6}{'ms/batch':>10}{'params MB':>11}{'opt MB':>9}{'total MB':>10}" + (f"{'GPU peak MB':>13}" if cuda else ''))
    ms = {k: 1000*statistics.median(v) for k,v in times.items()}
    for k,r in peaks.items():
        print(f"{k:6}{ms[k]:10.1f}{r['params']/2**20:11.2f}{r['opt']/2**20:9.2f}{r['total']/2**20:10.2f}" + (f"{gpu[k]/2**20:13.1f}" if cuda else ''))
    print(f"FSDP2/DDP: time per batch x{ms['fsdp']/ms['ddp']:.2f}, parameter+optimizer bytes per process x{peaks['fsdp']['total']/peaks['ddp']['total']:.2f}")
