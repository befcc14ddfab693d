"""An accelerated `Learner` against a hand-written Accelerate loop on XLA, in the venv of tools/xla_check.sh.

    bash tools/xla_check.sh --bench        # this benchmark (about a minute on 2 cores), then the XLA tests
    PJRT_DEVICE=CPU ~/.cache/fastxtend_accel/venv-xla/bin/python bench/bench_xla.py --tiny    # smoke run

Both train the same MLP with torch's AdamW on the same torch `DataLoader`; the hand-written loop goes through
`Accelerator.prepare` (Accelerate's `MpDeviceLoaderWrapper`: a graph cut per batch, batches sent ahead by a thread),
the `Learner` through `.accelerate()` (a graph cut after each batch's step). Reported: ms per training batch once
compiled (median over interleaved repeats: an epoch's training batches, from the first to the
device's end; the `Learner`'s set-up and validation left out), and XLA compilations in each epoch of a first fit.
The hand-written loop is timed as written for a TPU (no host read of the loss) and with `loss.item()` every step, which
is what a `Learner` does for its smooth loss.
"""
import argparse, os, statistics, time
os.environ.setdefault('PJRT_DEVICE', 'CPU')
import torch, torch_xla, torch_xla.core.xla_model as xm
torch_xla.device() # before any backward on the CPU (pytorch/xla#4174)
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from accelerate import Accelerator
from fastxtend_accel.core import *
from fastxtend_accel.xla import xla_compilations

p = argparse.ArgumentParser()
p.add_argument('--n', type=int, default=6400, help='training items (n/bs batches an epoch)')
p.add_argument('--bs', type=int, default=64)
p.add_argument('--n-in', type=int, default=64)
p.add_argument('--hidden', type=int, default=256)
p.add_argument('--epochs', type=int, default=3, help='epochs of the first fit, whose compilations are counted')
p.add_argument('--repeats', type=int, default=5, help='timed epochs of each variant, interleaved')
p.add_argument('--tiny', action='store_true', help='a smoke run: tiny sizes, one repeat')
args = p.parse_args()
if args.tiny: args.n,args.hidden,args.epochs,args.repeats = 256,32,2,1

def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(args.n_in, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                         nn.Linear(args.hidden, 10))

def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.n_in, generator=g)
    return TorchDL(TensorDataset(x, (x[:, :10].argmax(1))), batch_size=args.bs, shuffle=True, drop_last=True)

def adamw(params): return torch.optim.AdamW(params, lr=1e-3)

def accelerate_loop(read_loss):
    "A hand-written Accelerate training loop; each call trains an epoch and returns its XLA compilations"
    acc = Accelerator()
    model = mlp()
    model,opt,dl = acc.prepare(model, adamw(model.parameters()), data()) # Accelerate points the optimizer at the moved parameters
    def epoch():
        c,start = xla_compilations(),time.perf_counter()
        for xb,yb in dl:
            loss = F.cross_entropy(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if read_loss: loss.item()
        xm.wait_device_ops()
        return xla_compilations() - c,time.perf_counter() - start
    return epoch,len(dl)

class TrainOnly(Callback):
    "Time the training phase and count its compilations (the device waited for at its end), and leave validation out"
    order = 100
    def before_train(self): self.start,self.compiles = time.perf_counter(),xla_compilations()
    def after_train(self):
        xm.wait_device_ops()
        self.elapsed,self.compiled = time.perf_counter() - self.start,xla_compilations() - self.compiles
    def before_validate(self): raise CancelValidException()

def learner_loop():
    "An accelerated `Learner` with torch's AdamW (through `OptimWrapper`); each call fits an epoch"
    dl = data()
    learn = Learner(DataLoaders(dl, dl), mlp(), loss_func=F.cross_entropy, opt_func=partial(OptimWrapper, opt=torch.optim.AdamW),
                    lr=1e-3, cbs=TrainOnly()).accelerate()
    def epoch():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        return learn.train_only.compiled,learn.train_only.elapsed
    return epoch,len(dl)

variants = {'Accelerate XLA loop': lambda: accelerate_loop(False), 'Accelerate XLA loop, loss.item() each step': lambda: accelerate_loop(True),
            'fastxtend_accel Learner': learner_loop}
runs,compiled,ms = {},{},{k: [] for k in variants}
for k,make in variants.items():
    runs[k] = make()
    compiled[k] = [runs[k][0]()[0] for _ in range(args.epochs)] # the first fit: compilations per epoch
for _ in range(args.repeats):
    for k,(epoch,n) in runs.items(): ms[k].append(epoch()[1]*1000/n) # the training batches of an epoch, from the first to the device's end

print(f"XLA device {xm.xla_device_hw(torch_xla.device())}, MLP {args.n_in}-{args.hidden}-{args.hidden}-10, bs {args.bs}, "
      f"{args.n//args.bs} batches an epoch, torch {torch.__version__}, torch_xla {torch_xla.__version__}\n")
print('| variant | ms/batch (median) | min | compilations per epoch (first fit) |\n|---|---|---|---|')
for k in variants: print(f'| {k} | {statistics.median(ms[k]):.3f} | {min(ms[k]):.3f} | {compiled[k]} |')
med = {k: statistics.median(v) for k,v in ms.items()}
ratio = med['fastxtend_accel Learner']/med['Accelerate XLA loop']
print(f"\nfastxtend_accel Learner / Accelerate XLA loop, loss.item() each step: {med['fastxtend_accel Learner']/med['Accelerate XLA loop, loss.item() each step']:.2f}x")
print(f"target: fastxtend_accel Learner / Accelerate XLA loop <= 1.10x: {ratio:.2f}x -> {'PASS' if ratio <= 1.10 else 'FAIL'}")
