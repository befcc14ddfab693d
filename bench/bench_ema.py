"""What weight averaging costs a training step: the same accelerated `Learner` without and with `EMACallback`, side by side.

    .venv/bin/python bench/bench_ema.py             # an MLP and a small CNN, 200 steps x 7 repeats each, ~1 min on 2 CPU cores
    .venv/bin/python bench/bench_ema.py --device cuda

Variants, interleaved in every repeat, each one training epoch of the same model and data (bench_loop.py's pieces): no
average; `EMACallback` (one `torch._foreach_lerp_` over the weights after each optimizer step); `EMAWarmupCallback` (the
same, its decay from a cosine schedule each step). The share printed is the median extra time a step over the step
without the average; the model's weights are read once more and the average written, so the share is largest where the
step does least per weight (the MLP's batches of 64)."""
import argparse, statistics, warnings
import torch
from torch import nn
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastxtend_accel.all import *
from bench_loop import mlp, learner, TrainTimer, interleave, table, ratio, use_clock

def cnn(device='cpu'):
    "A small CNN on 1x8x8 images, bench_peers.py's model B"
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32*4*4, 10)).to(device)

def ema_loop(model, dl, cb=None, device='cpu'):
    "A training epoch of an accelerated `Learner` (with `cb`), timed by `TrainTimer`"
    learn = learner(model, dl, cbs=[TrainTimer()] + ([cb] if cb else [])).accelerate(cpu=device == 'cpu')
    def run():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        return learn.train_timer.elapsed
    return run

def bench(name, model, x, y, args):
    dl = TorchDL(TensorDataset(x, y), batch_size=args.bs, drop_last=True)
    runs = {'no average': ema_loop(model(), dl, device=args.device),
            'EMACallback': ema_loop(model(), dl, EMACallback(decay=0.999), args.device),
            'EMAWarmupCallback': ema_loop(model(), dl, EMAWarmupCallback(), args.device)}
    times = interleave(runs, args.repeats, per=args.steps)
    n = sum(p.numel() for p in model().parameters())
    print(f"\n{name} ({n:,} parameters), bs {args.bs}, AdamW, {args.steps} steps x {args.repeats} interleaved repeats, "
          f"{args.device}, torch {torch.__version__}")
    print(table(times, 'no average', unit='us/step', scale=1e6))
    base = statistics.median(times['no average'])
    for k in list(runs)[1:]:
        r = ratio(times, k, 'no average')
        print(f"{k}: {(r-1)*base*1e6:+.1f} us a step, {100*(r-1):+.1f}% of the step without it "
              f"(runs {min(times[k])*1e6:.0f}-{max(times[k])*1e6:.0f} us a step)")

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--bs', type=int, default=64)
    p.add_argument('--steps', type=int, default=200, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--device', default='cpu')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    if args.device == 'cpu':
        torch.set_num_threads(1)
        use_clock('cpu') # this process's CPU time: steadier than the wall clock on a shared machine
    n = args.steps*args.bs
    x,y = torch.randn(n, 64),torch.randint(0, 10, (n,))
    bench('MLP 64-1024-1024-10', partial(mlp, 64, 1024, args.device), x, y, args)
    bench('CNN conv16-conv32/2-linear', partial(cnn, args.device), x.view(n, 1, 8, 8), y, args)

if __name__ == '__main__': main()
