"""Time per training step of one model, the same data, optimizer and batch size, timed side by side.

    .venv/bin/python bench/bench_loop.py            # the mid-size MLP, about 20 s on 2 CPU cores
    .venv/bin/python bench/bench_loop.py --n-in 64 --hidden 256 --bs 64 --steps 200   # the tiny one

Variants, interleaved in every repeat: a hand-written torch loop, a hand-written Accelerate loop, a stock fastai
`Learner`, a fastxtend_accel `Learner` with `.accelerate()` (1 process), and Lightning Fabric if it is installed.
All read the same torch `DataLoader`; fastai's `TfmdDL` is timed on its own (iteration only).

The pieces (model, the one hand-written step, learners, interleaved timing, tables) are shared with
`bench_fastai.py`, which runs this comparison for two model sizes among its other sections.
"""
import argparse, statistics, time, warnings
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastxtend_accel.core import *
from accelerate import Accelerator

clock = time.perf_counter # `use_clock('cpu')` switches every timing here to this process's CPU time

def use_clock(name):
    "Time with the wall clock ('wall') or this process's CPU time ('cpu': steadier on a machine that other jobs share)"
    global clock
    clock = dict(wall=time.perf_counter, cpu=time.process_time)[name]

def mlp(n_in, hidden, device='cpu'):
    "The benchmarks' model, `n_in`-`hidden`-`hidden`-10, with the same initial weights every time"
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(device)

def adamw(model): return torch.optim.AdamW(model.parameters(), lr=1e-4)

def step_loop(model, opt, dl, backward, device=None):
    "One epoch of the hand-written training step, with `backward` called on the loss"
    def run():
        for xb,yb in dl:
            if device is not None: xb,yb = xb.to(device, non_blocking=True),yb.to(device, non_blocking=True)
            backward(F.cross_entropy(model(xb), yb))
            opt.step()
            opt.zero_grad()
    return run

def torch_loop(model, dl): return step_loop(model, adamw(model), dl, torch.Tensor.backward, next(model.parameters()).device)

def accelerate_loop(model, dl):
    acc = Accelerator()
    model,opt,dl = acc.prepare(model, adamw(model), dl)
    return step_loop(model, opt, dl, acc.backward)

class TrainTimer(Callback):
    "Time the training phase of a fit, leaving set-up and validation out"
    order = 100
    def before_train(self): self.start = clock()
    def after_train(self):
        _sync()
        self.elapsed = clock() - self.start
    def before_validate(self): raise CancelValidException()

def learner(model, train, valid=None, accelerate=False, cbs=None):
    "The `Learner` a user builds around `model`, AdamW through `OptimWrapper`, with `.accelerate()` if asked"
    learn = Learner(DataLoaders(train, train if valid is None else valid), model, loss_func=F.cross_entropy,
                    opt_func=partial(OptimWrapper, opt=torch.optim.AdamW), lr=1e-4, cbs=cbs)
    return learn.accelerate() if accelerate else learn

def learner_loop(model, dl, accelerate=False, cbs=None):
    "A training epoch of a `Learner`, timed by `TrainTimer`"
    learn = learner(model, dl, accelerate=accelerate, cbs=[TrainTimer(), *L(cbs)])
    def run():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        return learn.train_timer.elapsed
    return run

def fabric_loop(model, dl):
    from lightning.fabric import Fabric
    fabric = Fabric(devices=1)
    model,opt = fabric.setup(model, adamw(model))
    return step_loop(model, opt, fabric.setup_dataloaders(dl), fabric.backward)

def iterate(dl):
    def run():
        for b in dl: pass
    return run

def _sync():
    if torch.cuda.is_available(): torch.cuda.synchronize()

def timed(run):
    "Seconds `run` takes, or the seconds it returns itself"
    start = clock()
    res = run()
    _sync()
    return res if res is not None else clock() - start

def interleave(runs, repeats, per=1, warmup=True):
    "Seconds per `per` units of each of `runs` (a dict of callables), all run once per repeat, in turn"
    if warmup:
        for run in runs.values(): run()
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for k,run in runs.items(): times[k].append(timed(run)/per)
    return times

def table(times, ref, unit='ms/step', scale=1e3, ratio_keys=None, refs=None):
    "Markdown table of median, min-max and ratios to the median of `times[ref]` (and of each `refs[k]` for row `k`)"
    med = {k: statistics.median(ts) for k,ts in times.items()}
    keys = list(times) if ratio_keys is None else ratio_keys
    rows = [f"| {'variant':<44} | {unit} (median) | min-max | vs {ref} |", f"|{'-'*46}|---|---|---|"]
    for k,ts in times.items():
        r = (refs or {}).get(k, ref)
        ratio = f"{med[k]/med[r]:.3f}x" + ('' if r == ref else f" (vs {r})") if k in keys or k in (refs or {}) else ''
        rows.append(f"| {k:<44} | {med[k]*scale:.3f} | {min(ts)*scale:.3f}-{max(ts)*scale:.3f} | {ratio} |")
    return '\n'.join(rows)

def ratio(times, a, b): return statistics.median(times[a])/statistics.median(times[b])

def verdict(name, value, limit, results=None):
    "A target's line, `PASS` if `value <= limit`; appended to `results` if given"
    line = f"target: {name} <= {limit}x: {value:.3f}x -> {'PASS' if value <= limit else 'FAIL'}"
    if results is not None: results.append((name, value, limit))
    return line

def compare_loops(n_in, hidden, bs, steps, repeats, device='cpu', fabric=True):
    "Seconds per step of every loop over one torch `DataLoader`, and per batch of iterating it and a `TfmdDL`"
    x,y = torch.randn(steps*bs, n_in),torch.randint(0, 10, (steps*bs,))
    dl = TorchDL(TensorDataset(x, y), batch_size=bs, drop_last=True, pin_memory=device == 'cuda')
    model = partial(mlp, n_in, hidden, device)
    runs = {'torch loop': torch_loop(model(), dl),
            'Accelerate loop': accelerate_loop(model(), dl),
            'fastai Learner': learner_loop(model(), dl),
            'fastxtend_accel Learner': learner_loop(model(), dl, accelerate=True)}
    if fabric:
        try: runs['Lightning Fabric'] = fabric_loop(model(), dl)
        except ImportError: pass
    tfmd = TfmdDL([(x[i], y[i]) for i in range(len(x))], bs=bs, drop_last=True, num_workers=0)
    runs |= {'torch DataLoader (iterate)': iterate(dl), 'fastai TfmdDL (iterate)': iterate(tfmd)}
    return interleave(runs, repeats, per=steps)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--n-in', type=int, default=784)
    p.add_argument('--hidden', type=int, default=512)
    p.add_argument('--bs', type=int, default=128)
    p.add_argument('--steps', type=int, default=100, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=9)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', help='try a wider --hidden on a GPU')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--clock', choices=['wall', 'cpu'], help="default: 'cpu' (this process's CPU time) on a CPU with 1 thread, else 'wall'")
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ('cpu' if args.device == 'cpu' and args.threads == 1 else 'wall')
    use_clock(args.clock)
    times = compare_loops(args.n_in, args.hidden, args.bs, args.steps, args.repeats, args.device)
    if 'Lightning Fabric' not in times: print('(Lightning Fabric not installed: `pip install lightning` to add it)')
    print(f"\nMLP {args.n_in}-{args.hidden}-{args.hidden}-10, bs {args.bs}, AdamW, {args.steps} steps x {args.repeats} interleaved repeats, "
          f"{args.device}, {torch.get_num_threads()} threads, {args.clock} clock, torch {torch.__version__}")
    print(table(times, 'Accelerate loop', ratio_keys=[k for k in times if 'iterate' not in k],
                refs={'fastai TfmdDL (iterate)': 'torch DataLoader (iterate)'}))
    print(f"\nratio to the torch loop: fastxtend_accel Learner {ratio(times, 'fastxtend_accel Learner', 'torch loop'):.3f}x")
    print(verdict('fastxtend_accel Learner / Accelerate loop', ratio(times, 'fastxtend_accel Learner', 'Accelerate loop'),
                  1.03 if args.device == 'cuda' else 1.05))

if __name__ == '__main__': main()
