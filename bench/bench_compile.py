"""Eager vs `torch.compile` training throughput, for a hand-written loop and for a fastai `Learner` on the same model and data.

    python bench/bench_compile.py [--repeats 7] [--blocks 4] [--width 128] [--bs 512]

Prints the ratios issue 3 asks for: Learner speedup / raw-loop speedup (target >= 0.95), recompiles per
Learner fit (target <= 2), and first-fit compile time, Learner / raw loop (target <= 1.2). Both compiled
paths use inductor with its on-disk caches disabled, so each first fit compiles from scratch; compile times
are measured twice each, in the order Learner, raw, raw, Learner, so that order effects cancel.
"""
import argparse, os, statistics, time
from functools import partial

import torch
from torch import nn
import torch.nn.functional as F
import torch.compiler.config
from fastxtend_accel.patching import compiled_graphs, clear_compiled_graphs
from fastai.basics import Learner, DataLoaders, DataLoader, OptimWrapper, Callback, set_seed, L
from fastxtend_accel.compiler import *

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6): super().__init__(); self.weight,self.eps = nn.Parameter(torch.ones(d)),eps
    def forward(self, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

class Block(nn.Module):
    "A residual RMSNorm + SwiGLU block: its many elementwise ops are what inductor fuses on CPU (plain Linear+GELU MLPs gain nothing there)"
    def __init__(self, d): super().__init__(); self.norm,self.up,self.down = RMSNorm(d),nn.Linear(d, 4*d),nn.Linear(2*d, d)
    def forward(self, x):
        a,b = self.up(self.norm(x)).chunk(2, -1)
        return x + self.down(F.silu(a)*b)

class BlockNet(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.stem,self.blocks,self.norm,self.head = nn.Linear(64, d),nn.ModuleList(Block(d) for _ in range(n)),RMSNorm(d),nn.Linear(d, 10)
    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks: x = b(x)
        return self.head(self.norm(x))

def make_dls(bs, n_train=12288, n_valid=1000):
    "Synthetic 64-feature, 10-class data; the validation set ends in a ragged batch"
    g = torch.Generator().manual_seed(0)
    x,w = torch.randn(n_train+n_valid, 64, generator=g),torch.randn(64, 10, generator=g)
    y = (x@w).argmax(1)
    items = L(zip(x, y))
    return DataLoaders(DataLoader(items[:n_train], bs=bs, shuffle=True, drop_last=True),
                       DataLoader(items[n_train:], bs=bs))

opt_func = partial(OptimWrapper, opt=torch.optim.AdamW)

class RawLoop:
    "The hand-written loop: the same data, model, loss and optimizer, compiled with PyTorch's own `model.compile()`"
    def __init__(self, dls, model, compiled, lr=1e-3):
        self.dls,self.model = dls,model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)
        if compiled: model.compile()
    def epoch(self):
        "Seconds for one training epoch (and its step count), then a validation pass"
        self.model.train()
        start,n = time.perf_counter(),0
        for xb,yb in self.dls.train:
            loss = F.cross_entropy(self.model(xb), yb)
            loss.backward()
            self.opt.step(); self.opt.zero_grad()
            n += 1
        t = time.perf_counter()-start
        self.model.eval()
        with torch.no_grad():
            for xb,yb in self.dls.valid: F.cross_entropy(self.model(xb), yb)
        return t,n

class TrainTimer(Callback):
    order = 100
    def before_train(self): self.start,self.n = time.perf_counter(),0
    def after_batch(self): self.n += self.training
    def after_train(self): self.t = time.perf_counter()-self.start

class LearnerLoop:
    "The same, through `Learner.fit`"
    def __init__(self, dls, model, compiled, lr=1e-3):
        self.learn,self.lr = Learner(dls, model, loss_func=nn.CrossEntropyLoss(), opt_func=opt_func, cbs=TrainTimer()),lr
        if compiled: self.learn.compile()
    def epoch(self):
        with self.learn.no_bar(), self.learn.no_logging(): self.learn.fit(1, self.lr)
        return self.learn.train_timer.t,self.learn.train_timer.n

graphs = compiled_graphs

def warm_up_inductor():
    "Compile a tiny model once, so neither measured first fit pays for inductor's one-off start-up (imports, worker pool)"
    m = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    m.compile()
    m(torch.randn(4, 8)).sum().backward()

def compile_time(make):
    "Seconds a new compiled loop's first epoch takes beyond its second, the graphs the first captured, and those the second added"
    torch.compiler.reset(); clear_compiled_graphs()
    loop = make()
    start = time.perf_counter(); loop.epoch(); first = time.perf_counter()-start
    n = graphs()
    start = time.perf_counter(); loop.epoch(); second = time.perf_counter()-start
    return first-second,n,graphs()-n

def main(repeats, blocks, width, bs):
    load = os.getloadavg()
    torch.compiler.config.force_disable_caches = True # every compile from scratch, whichever runs first
    dls = make_dls(bs)
    def model(): set_seed(0); return BlockNet(width, blocks)
    makers = dict(raw_eager=lambda: RawLoop(dls, model(), False), raw_compiled=lambda: RawLoop(dls, model(), True),
                  learner_eager=lambda: LearnerLoop(dls, model(), False), learner_compiled=lambda: LearnerLoop(dls, model(), True))
    warm_up_inductor()
    compiles = {'raw': [], 'learner': []}
    for k in ('learner', 'raw', 'raw', 'learner'): compiles[k].append(compile_time(makers[f'{k}_compiled'])) # ABBA: order effects cancel
    secs = {k: statistics.mean(o[0] for o in v) for k,v in compiles.items()}
    torch.compiler.reset(); clear_compiled_graphs()
    loops = {k: make() for k,make in makers.items()}
    for loop in loops.values(): loop.epoch() # compile, warm up
    rates = {k: [] for k in loops}
    for r in range(repeats): # interleaved, so drifts in machine load hit every loop alike
        for k,loop in loops.items():
            t,n = loop.epoch()
            rates[k].append(n/t)
    med = {k: statistics.median(v) for k,v in rates.items()}
    raw_speedup,learner_speedup = med['raw_compiled']/med['raw_eager'],med['learner_compiled']/med['learner_eager']
    print(f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"BlockNet({width=}, {blocks=}), bs={bs}, {len(dls.train)} steps/epoch, {repeats} interleaved repeats, medians\n")
    print(f"{'loop':<18}{'steps/s':>10}{'min':>10}{'max':>10}")
    for k in loops: print(f"{k:<18}{med[k]:>10.1f}{min(rates[k]):>10.1f}{max(rates[k]):>10.1f}")
    print()
    fmt = lambda v: ', '.join(f'{o[0]:.1f}' for o in v)
    rows = [("raw-loop speedup (compiled/eager)", f"{raw_speedup:.3f}", ""),
            ("Learner speedup (compiled/eager)", f"{learner_speedup:.3f}", ""),
            ("Learner speedup / raw-loop speedup", f"{learner_speedup/raw_speedup:.3f}", ">= 0.95"),
            ("recompiles in the Learner's first fit", f"{max(o[1] for o in compiles['learner'])-1}", "<= 2"),
            ("graphs added by the Learner's second fit", f"{max(o[2] for o in compiles['learner'])}", "0"),
            ("recompiles in the raw loop's first fit", f"{max(o[1] for o in compiles['raw'])-1}", ""),
            ("first-fit compile time, raw loop (s)", f"{secs['raw']:.1f}", f"runs: {fmt(compiles['raw'])}"),
            ("first-fit compile time, Learner (s)", f"{secs['learner']:.1f}", f"runs: {fmt(compiles['learner'])}"),
            ("compile time Learner / raw loop", f"{secs['learner']/secs['raw']:.3f}", "<= 1.2")]
    for name,value,target in rows: print(f"{name:<44}{value:>10}  {target}")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--blocks', type=int, default=4)
    p.add_argument('--width', type=int, default=128)
    p.add_argument('--bs', type=int, default=512)
    main(**vars(p.parse_args()))
