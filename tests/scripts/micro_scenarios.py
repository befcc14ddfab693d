"Micro-batches on 2 processes (torchrun) where process 1 alone is short of memory: each rank saves what it saw."
import os, sys, torch
from contextlib import nullcontext, ExitStack
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.microbatch import MicroBatchError
from fastxtend_accel.test_utils import synth_wide_learner, memory_limit

out,rank = Path(sys.argv[1]),int(os.environ.get('RANK', 0))
def short(mib): return memory_limit(mib*2**20) if rank == 1 else nullcontext() # process 1's address space capped

class Passes(Callback):
    "The items of each training pass, by batch"
    order = 95
    def before_fit(self): self.seen = []
    def before_batch(self):
        if self.training: self.seen.append([])
    def after_pred(self):
        if self.training: self.seen[-1].append(find_bs(self.yb))

# 4096 items: 3 training batches of 512 items on each process (1024 in all), SGD (its momentum's state, 10 MiB, at
# the first step); a batch of 512 needs 4 activations of 64 MiB
def fitted(micro_bs, limit=None, one_cycle=False, **kwargs):
    learn = synth_wide_learner(n=4096, opt_func=SGD).accelerate(micro_bs=micro_bs, **kwargs)
    passes = Passes()
    with learn.no_bar(), short(limit) if limit else nullcontext():
        if one_cycle: learn.fit_one_cycle(1, 1e-2, cbs=passes)
        else: learn.fit(1, 1e-2, cbs=passes)
    mb = learn.micro_batches
    return dict(params=[p.detach().clone() for p in learn.model.parameters()], values=learn.recorder.values,
                losses=[float(l) for l in learn.recorder.losses], passes=passes.seen, found=mb.found, tried=mb.tried)

res = {}
fitted(256) # the first fit of a process allocates for good what later fits reuse
res['auto'] = fitted('auto', limit=190)
res['auto_fixed'] = fitted(res['auto']['found'])
# a schedule and accumulation asked for on top: 2 batches a step
res['cycle'] = fitted('auto', limit=190, one_cycle=True, gradient_accumulation_steps=2)
res['cycle_fixed'] = fitted(res['cycle']['found'], one_cycle=True, gradient_accumulation_steps=2)

class ShortFromTraining(Callback):
    "Process 1's address space capped from the training's start (Accelerate's setup copies the weights for a while)"
    def __init__(self, stack, mib): self.stack,self.mib = stack,mib
    def before_train(self): self.stack.enter_context(short(self.mib))

# nothing fits on process 1: the gradients alone (75 MiB) need more than it has left
learn = synth_wide_learner(n=4096, width=2**18, opt_func=SGD).accelerate(micro_bs='auto')
before = [p.detach().clone() for p in learn.model.parameters()]
with ExitStack() as stack:
    try:
        with learn.no_bar(), learn.no_logging(): learn.fit(1, cbs=ShortFromTraining(stack, 20))
        res['nothing'] = 'no error'
    except MicroBatchError as e: res['nothing'] = str(e)
res['nothing_same'] = all(torch.equal(a, b) for a,b in zip(before, learn.model.parameters()))

# the largest that trains on both, found ahead; the learner as it was
learn = synth_wide_learner(n=4096, opt_func=SGD).accelerate(micro_bs='auto')
before,rng = [p.detach().clone() for p in learn.model.parameters()],torch.get_rng_state()
with short(190): res['find'] = learn.find_micro_bs(start=32)
res['find_kept'] = (all(torch.equal(a, b) for a,b in zip(before, learn.model.parameters())),
                    torch.equal(rng, torch.get_rng_state()), learn.opt is None, learn.micro_batches.found)

# validation on its own: process 1 runs its share in parts, the metrics are the whole set's
learn = synth_wide_learner(n=4096, opt_func=SGD).accelerate(micro_bs='auto')
with learn.no_bar(): res['valid_plain'] = learn.validate()
with learn.no_bar(), short(100): res['valid_short'] = learn.validate()
res['valid_found'] = learn.micro_batches.valid_found
torch.save(res, out/f'rank{rank}.pt')
