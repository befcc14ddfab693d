"""Steps/s of one training step, the same model, data, optimizer and batch size, timed side by side.

    .venv/bin/python bench/bench_loop.py            # about a minute on 2 CPU cores

Variants, interleaved in every repeat: a hand-written torch loop, a hand-written Accelerate loop, a stock fastai
`Learner`, a fastxtend_accel `Learner` with `.accelerate()` (1 process), and Lightning Fabric if it is installed.
All read the same torch `DataLoader`; fastai's `TfmdDL` is timed on its own (iteration only).
"""
import argparse, statistics, time, warnings
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastxtend_accel.core import *
from accelerate import Accelerator

def mlp(hidden, device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(device)

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
    def before_train(self): self.start = time.perf_counter()
    def after_train(self):
        _sync()
        self.elapsed = time.perf_counter() - self.start
    def before_validate(self): raise CancelValidException()

def learner_loop(model, dl, accelerate=False):
    learn = Learner(DataLoaders(dl, dl), model, loss_func=F.cross_entropy,
                    opt_func=partial(OptimWrapper, opt=torch.optim.AdamW), lr=1e-4, cbs=TrainTimer())
    if accelerate: learn.accelerate()
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
    start = time.perf_counter()
    res = run()
    _sync()
    return res if res is not None else time.perf_counter() - start

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--hidden', type=int, default=512)
    p.add_argument('--bs', type=int, default=128)
    p.add_argument('--steps', type=int, default=100, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=9)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', help='try a wider --hidden on a GPU')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    torch.set_num_threads(2)
    x,y = torch.randn(args.steps*args.bs, 784),torch.randint(0, 10, (args.steps*args.bs,))
    dl = TorchDL(TensorDataset(x, y), batch_size=args.bs, drop_last=True, pin_memory=args.device == 'cuda')
    mlp_ = partial(mlp, args.hidden, args.device)
    variants = {'torch loop': torch_loop(mlp_(), dl),
                'Accelerate loop': accelerate_loop(mlp_(), dl),
                'fastai Learner': learner_loop(mlp_(), dl),
                'fastxtend_accel Learner': learner_loop(mlp_(), dl, accelerate=True)}
    try: variants['Lightning Fabric'] = fabric_loop(mlp_(), dl)
    except ImportError: print('(Lightning Fabric not installed: `pip install lightning` to add it)')
    tfmd = TfmdDL([(x[i], y[i]) for i in range(len(x))], bs=args.bs, drop_last=True, num_workers=0)
    loaders = {'torch DataLoader (iterate)': iterate(dl), 'fastai TfmdDL (iterate)': iterate(tfmd)}
    for run in [*variants.values(), *loaders.values()]: run() # warm up
    times = {k: [] for k in [*variants, *loaders]}
    for _ in range(args.repeats):
        for k,run in [*variants.items(), *loaders.items()]: times[k].append(timed(run)/args.steps)
    ref = statistics.median(times['Accelerate loop'])
    print(f"\nMLP 784-{args.hidden}-{args.hidden}-10, bs {args.bs}, AdamW, {args.steps} steps x {args.repeats} interleaved repeats, "
          f"{args.device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"| {'variant':<28} | ms/step (median) | min-max ms | steps/s | vs Accelerate loop |")
    print(f"|{'-'*30}|------------------|------------|---------|--------------------|")
    for k,ts in times.items():
        med = statistics.median(ts)
        ratio = f'{med/ref:.3f}x' if k in variants else ''
        print(f"| {k:<28} | {med*1e3:16.3f} | {min(ts)*1e3:.3f}-{max(ts)*1e3:.3f} | {1/med:7.0f} | {ratio:>18} |")
    tfmd_cost = statistics.median(times['fastai TfmdDL (iterate)'])/statistics.median(times['torch DataLoader (iterate)'])
    xt = statistics.median(times['fastxtend_accel Learner'])/ref
    print(f"\nfastai TfmdDL iteration costs {tfmd_cost:.2f}x the torch DataLoader's (not part of the steps above).")
    target = 1.03 if args.device == 'cuda' else 1.05
    print(f"target: fastxtend_accel Learner <= {target}x the Accelerate loop: {xt:.3f}x -> {'met' if xt <= target else 'NOT met'}")

if __name__ == '__main__': main()
