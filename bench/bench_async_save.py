"""Training stall of a checkpoint: synchronous vs asynchronous saves through `torch.distributed.checkpoint`.

    torchrun --standalone --nproc_per_node 2 bench/bench_async_save.py OUT [--width 2048] [--every 5]   # or python ... for 1 process

The same fit three times: without checkpoints, with `CheckpointCallback(every_steps=...)`, and with `async_save=True`. The stall is
the time the training loop spends in the callback (for async: copying the tensors, putting written checkpoints in place, waiting for
the previous write and, at the end of the fit, for the last one). The main process prints one JSON line per mode, then the ratio."""
import argparse, json, os, time, torch
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('out', help='folder for the checkpoints')
p.add_argument('--width', type=int, default=2048, help='hidden width of the MLP (2048: 4.7M parameters, checkpoints of 57 MB with Adam)')
p.add_argument('--every', type=int, default=5, help='checkpoint every this many optimizer steps')
p.add_argument('--epochs', type=int, default=2)
args = p.parse_args()

stalls = []
def timed(f):
    def _inner(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: stalls[-1] += time.perf_counter() - t
    return _inner
CheckpointCallback.after_batch,CheckpointCallback.after_fit = timed(CheckpointCallback.after_batch),timed(CheckpointCallback.after_fit)

parts = {} # the stall's parts: `save_state` (sync: the whole write; async: copying, then starting the background write), `finish_save` waits
def part(name, f):
    def _inner(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: parts[name] = parts.get(name, 0.) + time.perf_counter() - t
    return _inner
Learner.save_state,Learner.finish_save = part('save_state', Learner.save_state),part('finish_save', Learner.finish_save)

class BatchTime(Callback):
    order = 99
    def before_fit(self): self.times = []
    def before_batch(self): self.t = time.perf_counter()
    def after_batch(self):
        if self.training: self.times.append(time.perf_counter() - self.t)

def fit(mode):
    set_seed(0)
    x,y = torch.randn(2048, 256),torch.randint(0, 10, (2048,))
    dsets = Datasets(range(2048), [[x.__getitem__], [y.__getitem__]], splits=[list(range(1792)), list(range(1792, 2048))])
    dls = dsets.dataloaders(bs=64, device='cpu', num_workers=0)
    w = args.width
    learn = Learner(dls, nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)), loss_func=nn.CrossEntropyLoss())
    learn.accelerate()
    bt = BatchTime()
    cbs = [bt] if mode == 'none' else [bt, CheckpointCallback(Path(args.out)/mode, every_steps=args.every, every_epochs=None, keep=1,
                                                               async_save=mode == 'async')]
    stalls.append(0.); parts.clear()
    t0 = time.perf_counter()
    with learn.no_bar(), learn.no_logging(): learn.fit(args.epochs, 1e-3, cbs=cbs)
    total = time.perf_counter() - t0
    n_ckpt = 0 if mode == 'none' else learn.train_iter//args.every
    n_params = sum(p.numel() for p in learn.model.parameters())
    return dict(mode=mode, procs=learn.accelerator.num_processes, params_M=round(n_params/1e6, 2), ckpt_MB=round(3*4*n_params/1e6, 1),
                checkpoints=n_ckpt, stall_ms_per_ckpt=round(1e3*stalls[-1]/max(n_ckpt, 1), 1),
                **{f'{k}_ms_per_ckpt': round(1e3*v/max(n_ckpt, 1), 1) for k,v in parts.items()},
                median_batch_ms=round(1e3*sorted(bt.times)[len(bt.times)//2], 1), fit_s=round(total, 2))

fit('none') # warm-up, not reported
res = {m: fit(m) for m in ('none', 'sync', 'async')}
if int(os.environ.get('RANK', 0)) == 0:
    for r in res.values(): print(json.dumps(r))
    print(f"async stall / sync stall: {res['async']['stall_ms_per_ckpt']/res['sync']['stall_ms_per_ckpt']:.2f} "
          f"({res['async']['stall_ms_per_ckpt']} ms vs {res['sync']['stall_ms_per_ckpt']} ms per checkpoint of {res['sync']['ckpt_MB']} MB); "
          f"fit {res['none']['fit_s']} s without checkpoints, {res['sync']['fit_s']} s sync, {res['async']['fit_s']} s async")
