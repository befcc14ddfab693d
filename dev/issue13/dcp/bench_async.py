"Training stall of a checkpoint: synchronous vs asynchronous DCP saves. Run under torchrun; rank 0 prints a JSON line."
import argparse, json, time, torch
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('out'); p.add_argument('--async-save', action='store_true'); p.add_argument('--width', type=int, default=2048)
p.add_argument('--every', type=int, default=8); p.add_argument('--epochs', type=int, default=2)
args = p.parse_args()

timings = dict(save_state=[], finish_wait=[], batch=[])
def timed(name, f):
    def _inner(*a, **k):
        t = time.perf_counter(); res = f(*a, **k); timings[name].append(time.perf_counter() - t); return res
    return _inner
Learner.save_state = timed('save_state', Learner.save_state)
_finish = Learner.finish_save
def finish(self, wait=True):
    if not wait: return _finish(self, wait)
    return timed('finish_wait', _finish)(self, wait)
Learner.finish_save = finish

class BatchTime(Callback):
    order = 99
    def before_batch(self): self.t = time.perf_counter()
    def after_batch(self):
        if self.training: timings['batch'].append(time.perf_counter() - self.t)

set_seed(0)
x,y = torch.randn(2048, 256),torch.randint(0, 10, (2048,))
dsets = Datasets(range(2048), [[x.__getitem__], [y.__getitem__]], splits=[list(range(1792)), list(range(1792, 2048))])
dls = dsets.dataloaders(bs=64, device='cpu')
w = args.width
model = nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
learn = Learner(dls, model, loss_func=nn.CrossEntropyLoss())
learn.accelerate()
t0 = time.perf_counter()
with learn.no_bar(), learn.no_logging():
    learn.fit(args.epochs, 1e-3, cbs=[CheckpointCallback(Path(args.out), every_steps=args.every, every_epochs=None, keep=1, async_save=args.async_save), BatchTime()])
total = time.perf_counter() - t0
if learn.is_main_process:
    n_params = sum(p.numel() for p in learn.model.parameters())
    b = sorted(timings['batch'])
    print(json.dumps(dict(async_save=args.async_save, procs=learn.accelerator.num_processes, params_M=n_params/1e6, ckpt_MB=3*4*n_params/1e6,
                          saves=len(timings['save_state']), save_state_ms=[round(1e3*t, 1) for t in timings['save_state']],
                          finish_wait_ms=[round(1e3*t, 1) for t in timings['finish_wait']], median_batch_ms=round(1e3*b[len(b)//2], 1),
                          fit_s=round(total, 2))))
