"Training scenarios run on 2 processes (torchrun) or on 1 (`python`, with the global batch size): each rank saves what it saw."
import sys, torch
from pathlib import Path
from torch import nn
from fastai.basics import *
from fastai.callback.all import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import datablock_learner, synth_regression_learner

out = Path(sys.argv[1])
world = int(os.environ.get('WORLD_SIZE', 1))
bs = 16 if world > 1 else 32  # per process; the global batch is 32 either way

# 192 items, validated on themselves; x[:,0] is the item's index so callbacks can see which items came; plain SGD
regression_learner = partial(synth_regression_learner, n_valid=192, index_input=True, bs=bs, opt_func=SGD)

class Spy(Callback):
    "Record items seen, backward calls, optimizer steps and DDP all-reduces"
    order = 20
    def before_fit(self):
        self.items,self.steps,self.allreduces,self.backwards,self.kept,self.devices = [],0,0,0,[],set()
        acc = self.learn.accelerator
        if acc is not None:
            orig = acc.accelerator.backward
            def counted(loss, **kw): self.backwards += 1; return orig(loss, **kw)
            acc.accelerator.backward = counted
        if isinstance(self.learn.model, nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            def hook(state, bucket): self.allreduces += 1; return allreduce_hook(state, bucket)
            self.learn.model.register_comm_hook(None, hook)
    def before_batch(self):
        if not self.training: return
        self.items.append(self.xb[0][:,0].long().tolist())
        b = (*self.xb, *self.yb) # already on the device: the same tensors again, not copies
        self.kept.append([o is p for o,p in zip(self.learn._set_device(b), b)])
        self.devices.add(str(getattr(self.dl, 'device', None))) # a loader that was never moved has none
    def after_step(self): self.steps += 1
    def after_fit(self):
        acc = self.learn.accelerator
        if acc is not None: del acc.accelerator.backward

def params(learn): return [p.detach().clone() for p in learn.model.parameters()]

res = {}
# 1. plain fit, no shuffle: global batch i is items i*32..(i+1)*32 on 1 or 2 processes
learn = regression_learner().accelerate()
spy = Spy()
learn.fit(2, 1e-3, cbs=spy)
res['plain'] = dict(params=params(learn), items=spy.items, steps=spy.steps, backwards=spy.backwards,
                    allreduces=spy.allreduces, losses=[float(l) for l in learn.recorder.losses],
                    model_type=type(learn.model).__name__, kept=spy.kept, devices=spy.devices)

# 2. gradient accumulation: k=2 over 6 batches per epoch (192 items, global batch 32)
learn = regression_learner().accelerate(gradient_accumulation_steps=2)
spy = Spy()
class CountingClip(GradientClip):
    calls = 0
    def before_step(self): self.calls += 1; super().before_step()
clip = CountingClip(max_norm=1e6)
learn.fit(1, 1e-3, cbs=[spy, clip])
res['accum'] = dict(params=params(learn), steps=spy.steps, backwards=spy.backwards, allreduces=spy.allreduces,
                    clips=clip.calls)
# ... and the same global batches of 64 in one step each
learn = regression_learner(bs=bs*2).accelerate()
learn.fit(1, 1e-3)
res['accum_ref'] = dict(params=params(learn))

# ... and fastai's own `GradientAccumulation(n_acc=64)`: 2 global batches a step, its items counted over the processes
learn = regression_learner().accelerate()
spy = Spy()
learn.fit(1, 1e-3, cbs=[spy, GradientAccumulation(n_acc=64)])
res['fastai_accum'] = dict(params=params(learn), steps=spy.steps, backwards=spy.backwards, allreduces=spy.allreduces)

# 3. one-cycle schedule, shuffled data, after freezing the first layer group
learn = regression_learner(shuffle=True).accelerate()
learn.freeze_to(-1)
before = params(learn)
spy = Spy()
learn.fit_one_cycle(2, 1e-2, cbs=spy)
res['one_cycle'] = dict(lrs=list(learn.recorder.lrs), before=before, params=params(learn), items=spy.items)

# 4. bf16: dtype inside the model and of the loss
class DtypeSpy(Callback):
    def before_fit(self): self.dtypes = set(); self.h = self.learn.model[0].register_forward_hook(lambda m,i,o: self.dtypes.add(str(o.dtype)))
    def after_loss(self): self.loss_dtype = str(self.learn.loss.dtype)
    def after_fit(self): self.h.remove()
learn = regression_learner().accelerate(mixed_precision='bf16')
dspy = DtypeSpy()
learn.fit(1, 1e-3, cbs=dspy)
res['bf16'] = dict(dtypes=dspy.dtypes, loss_dtype=dspy.loss_dtype)

# 5. save / export from every rank: only the main process writes
learn = regression_learner().accelerate()
learn.fit(1, 1e-3)
learn.path = out
learn.save('model')
learn.export(out/'export.pkl')
x = torch.linspace(-1, 1, 40).view(5, 8)
res['save'] = dict(params=params(learn), preds=learn.model(x).detach())

# 6. a plain torch DataLoader, shuffled, over two epochs
from torch.utils.data import DataLoader as TorchDL, TensorDataset
ds = TensorDataset(torch.arange(96).float()[:,None].repeat(1, 8), torch.zeros(96))
learn = regression_learner()
learn.dls = DataLoaders(TorchDL(ds, batch_size=bs, shuffle=True, drop_last=True), TorchDL(ds, batch_size=bs))
learn.accelerate()
spy = Spy()
learn.fit(2, 0, cbs=spy)
res['torch_dl'] = dict(items=spy.items)

# 7. collectives
learn = regression_learner().accelerate()
rank = learn.accelerator.process_index
res['collectives'] = dict(
    gather=learn.gather(torch.tensor([rank, rank])).tolist(),
    all_gather=learn.all_gather(torch.tensor([float(rank)])).tolist(),
    reduce_mean=learn.reduce(torch.tensor(float(rank)), 'mean').item(),
    reduce_max=learn.reduce(torch.tensor(float(rank)), 'max').item(),
    broadcast=learn.broadcast({'from': rank}, from_process=1),
    broadcast_t=learn.broadcast(torch.tensor([rank*10.]), from_process=1).tolist(),
    is_main=learn.is_main_process, rank=rank, world=learn.accelerator.num_processes)
learn.barrier()
x = torch.tensor([1., 2.], requires_grad=True)
learn.all_gather(x*(rank+1), sync_grads=True).sum().backward()
res['collectives']['grad'] = x.grad.tolist()

# 8. work on the main process only, during and after a fit, on a DataBlock learner (TensorCategory targets)
class LogPreds(Callback):
    "What fastai's `TensorBoardCallback(log_preds=True)` does on the main process: a batch of its own after each epoch"
    order,shapes = Recorder.order+1,[]
    def after_epoch(self):
        if self.learn.is_main_process: self.learn.one_batch(0, self.dls.valid.one_batch()); self.shapes.append(tuple(self.learn.pred.shape))
learn = datablock_learner(n=256, bs=bs).accelerate()
log = LogPreds()
learn.fit(2, 1e-2, cbs=log)
if learn.is_main_process:
    preds,targs = learn.get_preds()
    dec,_,probs = learn.predict(7)
    loss,acc = learn.validate()
    learn.export(out/'datablock.pkl')
    res['rank0'] = dict(preds=preds, targs=targs, predict=(int(dec), probs), valid=(loss, acc), shapes=log.shapes,
                        params=params(learn), targ_type=type(targs).__name__)
learn.wait_for_everyone()

# 9. the smooth loss: each process's own during an epoch, the mean over processes after it, or at every batch when asked;
# no collective per training batch besides DDP's unless asked
class SmoothSpy(Callback):
    "Per training batch: `learn.smooth_loss` as a logger reads it (after the `Recorder`), and the all-reduces called from Python"
    order = Recorder.order+1
    def before_fit(self):
        self.seen,self.calls,self.n = [],[],0
        self.orig = torch.distributed.all_reduce
        def counting(*args, **kwargs): self.n += 1; return self.orig(*args, **kwargs)
        torch.distributed.all_reduce = counting
    def before_batch(self): self.n = 0
    def after_batch(self):
        if self.training: self.seen.append(float(self.learn.smooth_loss)); self.calls.append(self.n)
    def after_fit(self): torch.distributed.all_reduce = self.orig
for every in (False, True):
    learn = regression_learner().accelerate(smooth_loss_every_batch=every)
    spy = SmoothSpy()
    learn.fit(2, 1e-3, cbs=spy)
    res[f'smooth_every_{every}'] = dict(seen=spy.seen, calls=spy.calls, losses=[float(l) for l in learn.recorder.losses],
                                        train_loss=[v[0] for v in learn.recorder.values], smooth=float(learn.smooth_loss))

# 9. a non-finite loss on one process: every process skips that step, as a run that cancels it everywhere
from fastxtend_accel.guard import NonFiniteGuardCallback
class Poison(Callback):
    "Item 50 (global batch 1, on process 1 of 2) gives an infinite loss; or cancel batch 1's step everywhere"
    order = NonFiniteGuardCallback.order-1
    def __init__(self, cancel=False): self.cancel = cancel
    def after_loss(self):
        if not self.cancel and self.training and self.epoch == 0 and 50 in self.xb[0][:,0].long().tolist():
            self.learn.loss_grad = self.loss_grad*float('inf')
    def before_step(self):
        if self.cancel and self.epoch == 0 and self.iter == 1: raise CancelStepException()
guarded,guard = regression_learner().accelerate(),NonFiniteGuardCallback()
guarded.fit(2, 1e-3, cbs=[guard, Poison()])
cancelled = regression_learner().accelerate()
cancelled.fit(2, 1e-3, cbs=Poison(cancel=True))
res['guard'] = dict(params=params(guarded), cancelled=params(cancelled), skipped=guard.skipped)

# 10. timed checkpoints where the processes' clocks differ: process 1's says 100 s pass a step, process 0's 1 s
import tempfile
from fastxtend_accel.checkpoint import CheckpointCallback
learn = regression_learner().accelerate()
with tempfile.TemporaryDirectory() as d:
    d = learn.broadcast(d) # the main process's folder
    ck = CheckpointCallback(d, every_epochs=None, every_minutes=2, keep=10)
    ck.clock = lambda: (100 if rank == 1 else 1)*learn.train_iter
    learn.fit(1, 1e-3, cbs=ck)
    res['timed'] = sorted(p.name for p in Path(d).glob('ckpt-*'))
    learn.barrier()

# 11. the best checkpoint by a gathered column; a fit failing on every process at the same batch, checkpointed there
# and resumed exactly; a fit failing at different points, or on one process too late for the others: no checkpoint
import time, warnings
from fastxtend_accel.checkpoint.state import follow_pointer
class Fail(Callback):
    "Raise at training batch 2 of epoch 1: after its step, or inside it; `delay` seconds late"
    order = CheckpointCallback.order+1
    def __init__(self, in_step=False, delay=0): self.in_step,self.delay = in_step,delay
    def _fail(self):
        if self.training and self.epoch == 1 and self.iter == 2: time.sleep(self.delay); raise RuntimeError('bad batch')
    def before_step(self):
        if self.in_step: self._fail()
    def after_batch(self):
        if not self.in_step: self._fail()

def failing(d, fail, **kw):
    "A 3-epoch fit that `fail` ends, checkpointed by `kw`; what it left in `d`, and what it warned about"
    learn = regression_learner().accelerate()
    ck = CheckpointCallback(d, on_exception=True, **kw)
    ck.agree_seconds = 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        try: learn.fit(3, 1e-3, cbs=[ck, fail])
        except RuntimeError: pass
    learn.barrier()
    return learn,ck,dict(kept=sorted(p.name for p in d.glob('ckpt-*')),
                         warned=[str(o.message) for o in w if 'CheckpointCallback' in str(o.message)])

with tempfile.TemporaryDirectory() as d:
    d = Path(learn.broadcast(d))
    learn,ck,r = failing(d, Fail(), monitor='valid_loss', keep=1, keep_best=1)
    res['best'] = dict(r, best=follow_pointer(d/'best').name, scores=ck.scores,
                       values=[v[1] for v in learn.recorder.values])
    resumed,whole = regression_learner().accelerate(),regression_learner().accelerate()
    resumed.fit(3, 1e-3, cbs=CheckpointCallback(d, monitor='valid_loss', keep=1, keep_best=1, resume=True))
    whole.fit(3, 1e-3)
    res['failed_resumed'] = dict(resumed=params(resumed), whole=params(whole))
    learn.barrier()
# apart: no signals agreed after each step, which process 1 would wait in for process 0, failed inside that step
for name,fail,kw in (('failed_apart', Fail(in_step=rank == 0), dict(on_signal=False)),
                     ('failed_late', Fail(delay=3 if rank == 1 else 0), {})):
    with tempfile.TemporaryDirectory() as d:
        d = Path(learn.broadcast(d))
        res[name] = failing(d, fail, every_epochs=None, **kw)[2]
        learn.barrier()

torch.save(res, out/f'rank{rank}.pt')
